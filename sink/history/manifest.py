"""The history table's commit log: which Parquet files make up the table, changed atomically.

Spark's file sink lists every file it ever wrote in ``_spark_metadata`` and can never take one
out, so a table that is compacted or expires old days cannot use it. The job writes through
this log instead (pure Python, no Spark; a local or POSIX-mounted table directory):

    <table>/date=YYYY-MM-DD/<name>.parquet   data files; only those the newest version lists
                                             are part of the table
    <table>/_manifest/<N>.json               version N: every live file (path, UTC day and hour
                                             of its rows, bytes, rows, level, micro-batch), the
                                             last stream batch it holds, files removed and not
                                             yet deleted
    <table>/_spark_metadata/<N>.compact      version N again in Spark's file-sink log format:
                                             ``spark.read.parquet(table)``, catalog tables over
                                             the directory, spark-sql and the Thrift server all
                                             read it (MetadataLogFileIndex) and so see exactly
                                             the files of one committed version
    <table>/_staging/<id>/                   writers' output before it is committed

A commit (append a micro-batch's files, replace files by their compaction, drop expired days)
creates ``_manifest/<N+1>.json`` with link(2), which fails when the name exists: two writers
(the job and ``sink.maintain``) never both commit version N+1; the loser reads N+1 and tries
again (``commit``), or gives up when its change no longer applies (``Conflict``: a compaction
whose inputs someone else removed). Then the version's ``_spark_metadata`` file is written;
a writer first writes the ones missing below its version (a crash between the two steps), so
the Spark log never has a gap.

What one query reads to plan is one ``N.compact`` file: proportional to the live files, not to
every file ever written. Old versions are deleted (all but the last ``KEEP_VERSIONS``); files a
version removed are deleted ``delete_delay_ms`` after it (a query planned on an older version
can still read them meanwhile).

Exactly once with Spark's checkpoint (sink/history/writer.py): a version records the stream
batch it appended (``stream``: the checkpoint's query id and batch id); a micro-batch run again
after a crash between our commit and Spark's finds itself recorded and writes nothing.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, overload

from settings import environment
from sink.history.commits import fsync_dir as _fsync_dir  # (a module name: benches stub it)

log = logging.getLogger(__name__)

MANIFEST_DIR = "_manifest"
SPARK_LOG_DIR = "_spark_metadata"
STAGING_DIR = "_staging"
FORMAT = "mqtt-history-manifest"
FORMAT_VERSION = 1
KEEP_VERSIONS = 10           # manifest versions and Spark log files kept behind the newest
DELETE_DELAY_MS = 600_000    # removed data files are deleted this long after their removal
ORPHAN_AGE_MS = 3_600_000    # unlisted data files / staging dirs older than this are left-overs
COMMIT_ATTEMPTS = 100
_DATE = re.compile(r"date=(\d{4}-\d{2}-\d{2})")


class Conflict(Exception):
    """The change no longer applies to the newest version (someone else changed those files)."""


class OutsideTable(ValueError):
    """A manifest names a file that is not inside the table directory (an absolute path, a
    ``..`` step, or a symbolic link leading out): it is never read, listed or deleted."""


def inside(root: Path, rel: str) -> Path:
    """``root / rel`` when ``rel`` is a relative path that stays inside ``root`` (no ``..``,
    not absolute, no directory on the way that is a symbolic link out of it); else
    OutsideTable."""
    parts = rel.split("/")
    if (not rel or rel.startswith("/") or "\\" in rel or "\0" in rel
            or any(part in ("", ".", "..") for part in parts)):
        raise OutsideTable(f"the table's manifest names {rel!r}, which is not a file inside the "
                           f"table {root}: refused (restore that manifest from a backup or "
                           "delete the entry)")
    path = root / rel
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path.parent)]) != real_root:
        raise OutsideTable(f"the table's manifest names {rel!r}, whose directory leads out of "
                           f"the table {root} (a symbolic link): refused")
    return path


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class FileEntry:
    """One live data file. ``path`` is relative to the table; ``hour`` is the UTC hour of every
    row in it (None: files of Spark's file sink, adopted with their whole day); ``level``: 0 a
    micro-batch's file, 1 a merge of files of an hour still open, 2 a closed hour compacted."""
    path: str
    date: str
    hour: int | None
    size: int
    rows: int
    level: int = 0
    batch: int | None = None

    @property
    def bucket(self) -> tuple[str, int | None]:
        return (self.date, self.hour)

    @staticmethod
    def from_json(d: dict) -> "FileEntry":
        return FileEntry(path=d["path"], date=d["date"], hour=d.get("hour"), size=int(d["size"]),
                         rows=int(d["rows"]), level=int(d.get("level", 0)), batch=d.get("batch"))


@dataclass(frozen=True)
class Removed:
    path: str
    at: int    # ms: when the version that removed it was committed


@dataclass
class Snapshot:
    """One committed version of the table (id -1: the empty table before the first commit)."""
    id: int = -1
    committed_at: int = 0
    op: str = ""
    stream: dict | None = None            # {"id": checkpoint query id, "batch": last batch}
    files: list[FileEntry] = field(default_factory=list)
    removed: list[Removed] = field(default_factory=list)
    detail: dict = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {"format": FORMAT, "version": FORMAT_VERSION, "id": self.id,
               "committed_at": self.committed_at, "op": self.op, "stream": self.stream,
               "files": [_entry_json(f) for f in self.files],
               "removed": [asdict(r) for r in self.removed], "detail": self.detail}
        return json.dumps(doc, separators=(",", ":")).encode()

    @staticmethod
    def from_json(raw: bytes) -> "Snapshot":
        d = json.loads(raw)
        if d.get("format") != FORMAT or d.get("version") != FORMAT_VERSION:
            raise ValueError(f"not a history manifest of version {FORMAT_VERSION}")
        return Snapshot(id=int(d["id"]), committed_at=int(d["committed_at"]), op=d.get("op", ""),
                        stream=d.get("stream"),
                        files=[FileEntry.from_json(f) for f in d["files"]],
                        removed=[Removed(r["path"], int(r["at"])) for r in d.get("removed", [])],
                        detail=d.get("detail") or {})

    @property
    def paths(self) -> set[str]:
        return {f.path for f in self.files}

    def stream_batch(self, stream_id: str) -> int:
        """The last micro-batch of that stream this version holds (-1: none)."""
        if self.stream and self.stream.get("id") == stream_id:
            return int(self.stream.get("batch", -1))
        return -1

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


def _entry_json(f: FileEntry) -> dict:
    d = {"path": f.path, "date": f.date, "hour": f.hour, "size": f.size, "rows": f.rows,
         "level": f.level}
    if f.batch is not None:
        d["batch"] = f.batch
    return d


def date_of(path: str) -> str:
    """The ``date`` partition of a data file's relative path."""
    m = _DATE.search(path)
    if not m:
        raise ValueError(f"not in a date=YYYY-MM-DD directory: {path}")
    return m.group(1)


@dataclass
class Change:
    """What a commit does to the newest version: files added, files removed (each must be
    live, else Conflict), the stream batch it records, and a label for the log."""
    op: str
    add: list[FileEntry] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    stream: dict | None = None
    detail: dict = field(default_factory=dict)


# crash points (tests kill the process at each step: SINK_HISTORY_CRASH_AT=<name>)
def crash_point(name: str) -> None:
    if environment.SINK_HISTORY_CRASH_AT.get() == name:
        import signal
        try:
            if os.getpgid(0) == os.getpid():  # a process group leader takes its JVM along
                os.killpg(0, signal.SIGKILL)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)


class Table:
    """The commit log of one history table directory."""

    def __init__(self, path: str | os.PathLike, delete_delay_ms: int = DELETE_DELAY_MS,
                 clock: Callable[[], int] = now_ms) -> None:
        p = str(path)
        self.root = Path(p[len("file://"):] if p.startswith("file://") else p).absolute()
        self.delete_delay_ms = delete_delay_ms
        self.clock = clock
        self.manifests = self.root / MANIFEST_DIR
        self.spark_log = self.root / SPARK_LOG_DIR

    # ---- reading ------------------------------------------------------------------------------

    def exists(self) -> bool:
        return self.manifests.is_dir() and self.latest_id() >= 0

    def latest_id(self) -> int:
        try:
            ids = [int(n[:-5]) for n in os.listdir(self.manifests)
                   if n.endswith(".json") and n[:-5].isdigit()]
        except FileNotFoundError:
            return -1
        return max(ids, default=-1)

    def read(self, version: int) -> Snapshot:
        return Snapshot.from_json((self.manifests / f"{version}.json").read_bytes())

    def snapshot(self) -> Snapshot:
        """The newest committed version (an empty Snapshot when there is none)."""
        for _ in range(COMMIT_ATTEMPTS):
            n = self.latest_id()
            if n < 0:
                return Snapshot()
            try:
                return self.read(n)
            except FileNotFoundError:  # deleted by a writer's clean-up meanwhile: look again
                continue
        raise RuntimeError(f"cannot read the newest manifest of {self.root}")

    def abs(self, rel: str) -> Path:
        """The file a manifest entry names (OutsideTable unless inside the table)."""
        return inside(self.root, rel)

    # ---- committing ---------------------------------------------------------------------------

    @overload
    def commit(self, change: Change) -> Snapshot: ...
    @overload
    def commit(self, change: Callable[[Snapshot], Change | None]) -> Snapshot | None: ...

    def commit(self, change: Change | Callable[[Snapshot], Change | None]) -> Snapshot | None:
        """Commit ``change`` on top of the newest version; retried on top of whatever another
        writer committed meanwhile. ``change`` may be a function of the newest version (None:
        nothing to do). Returns the new version, or None when there was nothing to do. Raises
        Conflict when a file to remove is no longer live."""
        for _ in range(COMMIT_ATTEMPTS):
            base = self.snapshot()
            self.repair_spark_log(base)  # first: no Spark log gap, nor one naming deleted files
            ch = change(base) if callable(change) else change
            if ch is None:
                return None
            new = self._apply(base, ch)
            crash_point(f"{ch.op}:before-manifest")
            if self._create(new):
                crash_point(f"{ch.op}:after-manifest")
                self._write_spark_log(new)
                crash_point(f"{ch.op}:after-spark-log")
                self._clean_up(new)
                return new
        raise RuntimeError(f"could not commit to {self.root}: {COMMIT_ATTEMPTS} other commits "
                           "came first")

    def _apply(self, base: Snapshot, ch: Change) -> Snapshot:
        live = {f.path: f for f in base.files}
        missing = [p for p in ch.remove if p not in live]
        if missing:
            raise Conflict(f"{len(missing)} of the files to replace are no longer in the table "
                           f"(e.g. {missing[0]})")
        clash = [f.path for f in ch.add if f.path in live]
        if clash:
            raise Conflict(f"file already in the table: {clash[0]}")
        now = self.clock()
        for p in ch.remove:
            del live[p]
        files = list(live.values()) + list(ch.add)
        files.sort(key=lambda f: (f.date, -1 if f.hour is None else f.hour, f.path))
        removed = [r for r in base.removed if r.path not in live]  # (a re-added name is live)
        removed += [Removed(p, now) for p in ch.remove]
        # files removed long enough ago are deleted now and forgotten
        keep = []
        for r in removed:
            if now - r.at >= self.delete_delay_ms:
                try:
                    _unlink(self.abs(r.path))
                except OutsideTable as exc:   # never deleted; forgotten with the entry
                    log.error("%s", exc)
            else:
                keep.append(r)
        stream = ch.stream if ch.stream is not None else base.stream
        return Snapshot(id=base.id + 1, committed_at=now, op=ch.op, stream=stream, files=files,
                        removed=keep, detail=ch.detail)

    def _create(self, snap: Snapshot) -> bool:
        """Create version snap.id; False if another writer created it first."""
        self.manifests.mkdir(parents=True, exist_ok=True)
        tmp = self.manifests / f".tmp-{uuid.uuid4().hex}"
        _write_synced(tmp, snap.to_json())
        try:
            os.link(tmp, self.manifests / f"{snap.id}.json")
            _fsync_dir(self.manifests)
            return True
        except FileExistsError:
            return False
        finally:
            _unlink(tmp)

    def adopt(self, files: list[FileEntry], first_id: int, stream: dict | None) -> Snapshot:
        """The first version of a table another writer made (Spark's file sink: its log's
        batch ids end at first_id - 1): ``files`` as version ``first_id``, whose Spark log
        file then replaces the file sink's."""
        snap = Snapshot(id=first_id, committed_at=self.clock(), op="adopt", stream=stream,
                        files=sorted(files, key=lambda f: (f.date, f.path)))
        if not self._create(snap):
            raise Conflict(f"{self.root} got a manifest while it was being adopted")
        self._write_spark_log(snap)
        for v in self.spark_log_ids():
            if v < first_id:
                for name in (f"{v}.compact", str(v)):
                    _unlink(self.spark_log / name)
        return snap

    # ---- the Spark log (what Spark readers see) ----------------------------------------------

    def spark_log_line(self, f: FileEntry) -> str:
        p = self.abs(f.path)
        try:
            mtime = int(p.stat().st_mtime * 1000)
        except OSError:
            mtime = 0
        return json.dumps({"path": file_uri(p), "size": f.size, "isDir": False,
                           "modificationTime": mtime, "blockReplication": 1,
                           "blockSize": 33554432, "action": "add"}, separators=(",", ":"))

    def _write_spark_log(self, snap: Snapshot) -> None:
        """``_spark_metadata/<id>.compact``: every live file of the version. Every version is a
        compact file, so a reader needs the newest only (Spark derives the log's compaction
        interval, 1, from the two newest names)."""
        self.spark_log.mkdir(parents=True, exist_ok=True)
        text = "v1\n" + "".join(self.spark_log_line(f) + "\n" for f in snap.files)
        tmp = self.spark_log / f".tmp-{uuid.uuid4().hex}"
        _write_synced(tmp, text.encode())
        os.replace(tmp, self.spark_log / f"{snap.id}.compact")

    def spark_log_ids(self) -> list[int]:
        try:
            names = os.listdir(self.spark_log)
        except FileNotFoundError:
            return []
        return sorted(int(n.split(".")[0]) for n in names
                      if n.split(".")[0].isdigit() and not n.startswith("."))

    def repair_spark_log(self, latest: Snapshot | None = None, rewrite_latest: bool = False) -> int:
        """Write the Spark log files missing for the newest versions (a writer that died
        between its manifest and its Spark log file), oldest first. Returns how many."""
        latest = latest or self.snapshot()
        if latest.id < 0:
            return 0
        have = set(self.spark_log_ids())
        todo = [v for v in range(max(0, latest.id - KEEP_VERSIONS), latest.id + 1)
                if v not in have]
        if rewrite_latest and latest.id not in todo:
            todo.append(latest.id)
        done = 0
        for v in todo:
            try:
                snap = latest if v == latest.id else self.read(v)
            except FileNotFoundError:
                continue
            self._write_spark_log(snap)
            done += 1
        return done

    # ---- clean-up -----------------------------------------------------------------------------

    def _clean_up(self, snap: Snapshot) -> None:
        """Old versions (manifests and Spark log files, oldest first so the Spark log stays
        contiguous) beyond KEEP_VERSIONS."""
        below = snap.id - KEEP_VERSIONS
        for v in sorted(self.spark_log_ids()):
            if v >= below:
                break
            for name in (f"{v}.compact", str(v)):
                _unlink(self.spark_log / name)
        try:
            names = os.listdir(self.manifests)
        except FileNotFoundError:
            return
        for n in names:
            if n.endswith(".json") and n[:-5].isdigit() and int(n[:-5]) < below:
                _unlink(self.manifests / n)

    def expire_removed(self) -> Snapshot | None:
        """Commit a version that deletes the removed files whose delay has passed (none: no
        commit). The job calls it now and then, so files go even when nothing is written."""
        now = self.clock()

        def change(base: Snapshot) -> Change | None:
            if not any(now - r.at >= self.delete_delay_ms for r in base.removed):
                return None
            return Change(op="expire")
        return self.commit(change)

    def orphans(self, snap: Snapshot | None = None, min_age_ms: int = ORPHAN_AGE_MS) -> list[Path]:
        """Data files no version lists (left by a writer that died before its commit) and
        staging directories, older than ``min_age_ms``."""
        snap = snap or self.snapshot()
        known = snap.paths | {r.path for r in snap.removed}
        limit = (self.clock() - min_age_ms) / 1000
        out = []
        for d in self.root.glob("date=*"):
            if not d.is_dir() or d.is_symlink():
                continue   # (a link: its files are not the table's to delete)
            for p in d.rglob("*.parquet"):
                rel = p.relative_to(self.root).as_posix()
                try:
                    inside(self.root, rel)
                except OutsideTable:
                    continue
                if rel not in known and _mtime(p) < limit:
                    out.append(p)
        staging = self.root / STAGING_DIR
        if staging.is_dir():
            out += [p for p in staging.iterdir() if _mtime(p) < limit]
        return out

    def delete_orphans(self, min_age_ms: int = ORPHAN_AGE_MS) -> int:
        import shutil
        n = 0
        for p in self.orphans(min_age_ms=min_age_ms):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                _unlink(p)
            n += 1
        # partition directories left empty (expired days)
        live_dates = {f.date for f in self.snapshot().files}
        for d in self.root.glob("date=*"):
            if d.is_dir() and d.name[5:] not in live_dates:
                try:
                    d.rmdir()
                except OSError:
                    pass
        return n

    # ---- writers' staging area --------------------------------------------------------------

    def staging(self, label: str) -> Path:
        """A fresh staging directory for one writer's output."""
        d = self.root / STAGING_DIR / f"{label}-{uuid.uuid4().hex[:12]}"
        d.mkdir(parents=True)
        return d

    def place(self, staged: Iterable[tuple[Path, str, int | None]], prefix: str, batch: int | None,
              level: int) -> list[FileEntry]:
        """Move staged Parquet files (path, date, hour) into their ``date=`` directory under
        fresh names; their rows come from the Parquet footers. Returns their entries."""
        from sink.history.parquet_rows import parquet_rows  # not pyarrow: the job's driver stays small
        tag = uuid.uuid4().hex[:12]
        out = []
        for i, (src, date, hour) in enumerate(sorted(staged, key=lambda s: (s[1], s[2], str(s[0])))):
            rows = parquet_rows(src)
            if rows == 0:
                continue
            hh = "xx" if hour is None else f"{hour:02d}"
            rel = f"date={date}/{prefix}-h{hh}-{tag}-{i:04d}.parquet"
            dst = self.abs(rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
            out.append(FileEntry(path=rel, date=date, hour=hour, size=dst.stat().st_size,
                                 rows=rows, level=level, batch=batch))
        return out


def staged_files(staging: Path) -> list[tuple[Path, str, int | None]]:
    """Parquet files Spark wrote under ``staging`` partitioned by ``date`` (and ``_h``, the
    hour): (path, date, hour)."""
    out = []
    for p in staging.rglob("*.parquet"):
        parts = dict(seg.split("=", 1) for seg in p.relative_to(staging).parts[:-1] if "=" in seg)
        if "date" not in parts:
            continue
        hour = parts.get("_h")
        out.append((p, parts["date"], int(hour) if hour not in (None, "__HIVE_DEFAULT_PARTITION__")
                    else None))
    return out


def file_uri(p: Path) -> str:
    """file:///... as Spark writes them in its log (Hadoop's Path.toUri: '=' is not escaped)."""
    from urllib.parse import quote
    return "file://" + quote(str(p), safe="/=:@!$&'()*+,;-._~")


def _write_synced(path: Path, raw: bytes) -> None:
    with open(path, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())




def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return float("inf")
