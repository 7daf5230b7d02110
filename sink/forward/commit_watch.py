"""keep_until = "history": watching the history job's commits.

The forwarder remembers, per chunk Kafka acknowledged, the next offset of each partition it
wrote and the topic id (:class:`AckedChunk`, kept in its checkpoint). The history job reports
what its table has in its committed file (sink/history/commits.py); a chunk it covers is committed,
and the spool may let its records go. :class:`CommitWatcher` holds that list and the committed
position, reads the file, and says what keeps records waiting (no file and no job, an unsigned
file, a job writing another table, a job that stopped committing).
"""
from __future__ import annotations

import collections
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..history import commits
from .spool import SpoolPosition

log = logging.getLogger(__name__)


@dataclass(slots=True)
class AckedChunk:
    """An acknowledged chunk the history table may not have yet (keep_until = "history")."""
    end: int                              # spool position after it
    next_seq: int                         # seq after its last record
    offsets: dict                         # (topic, partition) -> offset after its records
    topic_ids: dict                       # topic -> topic id when written (None: unknown)

    def to_json(self) -> list:
        return [self.end, self.next_seq, [[t, p, n] for (t, p), n in self.offsets.items()], self.topic_ids]

    @classmethod
    def from_json(cls, v: list) -> "AckedChunk":
        end, next_seq, offsets, ids = v
        return cls(end, next_seq, {(t, p): n for t, p, n in offsets}, ids)


class CommitWatcher:
    """The acknowledged chunks the table may lack (``pending``), up to where it has every
    record (``committed_pos``, ``committed_seq``), and what keeps records waiting (``status``,
    ``problem``)."""

    def __init__(self, committed_file: str | None, committed_key: bytes | None = None,
                 job_file: str | None = None, stale_after: float = 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.committed_file = committed_file
        self.committed_key = committed_key   # None (tests): the committed file taken as it is
        self.job_file = job_file             # where the job says which committed file it writes
        self.stale_after = stale_after       # [sink] history_stale_seconds
        self.clock = clock
        self.pending: collections.deque[AckedChunk] = collections.deque()  # acked, not committed
        self.committed_pos = 0
        self.committed_seq = 0
        self.progress: dict[str, Any] | None = None   # the committed file's content, if trusted
        self._progress_key: tuple[int, int, int] | None = None
        self._file_state = "missing"      # ok | missing | unreadable | unsigned | bad_signature
        self._file_batch = None           # the job's last batch id seen, and when it changed:
        self._file_changed_at = 0.0
        self.waiting_since: float | None = None   # records wait for the table since (clock)
        self.status = "ok"                # ok, or what is wrong (see watch)
        self.problem = ""
        self._problem_logged: tuple[str | None, float] = (None, 0.0)

    # -- the checkpoint ---------------------------------------------------------------------------
    def load(self, committed: SpoolPosition, pending: Any = ()) -> None:
        """A (re)started forwarder: the committed position and the chunks saved by kafka_state."""
        self.committed_pos, self.committed_seq = committed
        self.pending = collections.deque(AckedChunk.from_json(v) for v in pending or ())

    def to_json(self, limit: int = 256) -> list:
        """The pending chunks for the checkpoint (merged down to `limit` entries)."""
        self.merge_pending(limit)
        return [c.to_json() for c in self.pending]

    def merge_pending(self, limit: int) -> None:
        """Keep the list short by merging neighbours (conservative: a merged entry is committed
        only when all of it is)."""
        pend = self.pending
        while len(pend) > limit:
            out: collections.deque[AckedChunk] = collections.deque()
            it = iter(pend)
            for a in it:
                b = next(it, None)
                if b is None:
                    out.append(a)
                    break
                offsets = dict(a.offsets)
                for tp, n in b.offsets.items():
                    offsets[tp] = max(n, offsets.get(tp, 0))
                out.append(AckedChunk(b.end, b.next_seq, offsets, {**a.topic_ids, **b.topic_ids}))
            pend = out
        self.pending = pend

    @property
    def committed(self) -> SpoolPosition:
        return SpoolPosition(self.committed_pos, self.committed_seq)

    def acked(self, chunk: AckedChunk) -> None:
        self.pending.append(chunk)

    # -- what the history table has committed -------------------------------------------------
    def read(self) -> None:
        """Read the job's committed file if it changed (stat)."""
        path = self.committed_file
        if not path:
            return
        try:
            st = os.stat(path)
        except OSError:
            self._file_state, self._progress_key = "missing", None
            return
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self._progress_key:
            return
        self._progress_key = key
        data = commits.read_committed(path, self.committed_key)
        if data is None:
            self._file_state = "unreadable"
            return
        if data["signature"] in ("unsigned", "bad"):
            # anyone who can write the file would make the spool delete records: not trusted
            self._file_state = "unsigned" if data["signature"] == "unsigned" else "bad_signature"
            return
        for t in data["topics"].values():      # "" (unknown) and null mean the same
            t["topic_id"] = t["topic_id"] or None
        self.progress, self._file_state = data, "ok"
        if data.get("batch_id") != self._file_batch:
            self._file_batch, self._file_changed_at = data.get("batch_id"), self.clock()

    def advance(self, acked: SpoolPosition, idle: bool, topic_ids: dict) -> str | None:
        """Drop from `pending` what the table has; the committed position follows. `idle`:
        nothing in flight or being rewound, everything read acknowledged (then all acknowledged
        is committed once `pending` is empty: torn tails, other shards' records). -> why Kafka
        lost data (the oldest chunk was written to a topic incarnation gone for good) or None."""
        self.read()
        state = self.progress
        pend = self.pending
        is_committed = commits.is_committed
        moved = False
        while pend:
            c = pend[0]
            if not all(is_committed(state, t, c.topic_ids.get(t), p, n - 1) for (t, p), n in c.offsets.items()):
                break
            pend.popleft()
            self.committed_pos, self.committed_seq = c.end, c.next_seq
            moved = True
        if not pend and idle:
            self.committed_pos = max(self.committed_pos, acked.pos)
            self.committed_seq = max(self.committed_seq, acked.seq)
        lost = self._dead_incarnation(pend[0], state, topic_ids) if pend and state is not None else None
        now = self.clock()
        if moved or not pend:
            self.waiting_since = None if not pend else now
        elif self.waiting_since is None:
            self.waiting_since = now
        self.watch(now, acked.seq)
        return lost

    def waiting_seconds(self) -> float:
        return round(self.clock() - self.waiting_since, 1) if self.waiting_since is not None else 0.0

    def _dead_incarnation(self, head: AckedChunk, state: dict, topic_ids: dict) -> str | None:
        """The oldest uncommitted chunk was acknowledged under a topic id (or none known) that
        is neither Kafka's nor the job's any more: its records went with that incarnation of the
        topic, and no commit of the job can ever cover it. Send again what the table lacks."""
        for (t, _p) in head.offsets:
            cur = topic_ids.get(t) or None
            job = state["topics"].get(t)
            if cur and job is not None and job["topic_id"] == cur and head.topic_ids.get(t) != cur:
                return (f"the oldest records the history table lacks were written to {t} under "
                        f"topic id {head.topic_ids.get(t) or '(unknown)'}; Kafka and the job now "
                        f"have {cur}")
        return None

    def _head_blocker(self, state: dict | None) -> str | None:
        """Why the job's commits cannot cover the oldest waiting chunk (None: they can, once
        the job gets that far)."""
        if state is None or not self.pending:
            return None
        head = self.pending[0]
        for (t, _p), _n in head.offsets.items():
            job = state["topics"].get(t)
            if job is None:
                return (f"the history job does not report Kafka topic {t} (does it read it? "
                        "[history] kafka_topics)")
            if job["topic_id"] != head.topic_ids.get(t):
                return (f"the job reads {t} under topic id {job['topic_id']}, these records were "
                        f"written under {head.topic_ids.get(t)}")
        return None

    def _other_table(self, job: dict | None) -> str | None:
        if job is None or job["committed_file"] == os.path.abspath(self.committed_file):  # type: ignore[type-var]
            return None
        return (f"the history job (pid {job.get('pid')}) writes table {job.get('table')} and "
                f"reports its commits in {job['committed_file']}, but this broker reads "
                f"{self.committed_file}: start both with one config ([history] table/checkpoint, "
                "no --table/--checkpoint flags) or set [sink] committed_file")

    def watch(self, now: float, acked_seq: int) -> None:
        """Say at once what keeps records in the spool (no committed file and no job running,
        an unsigned file, a job writing another table's), or when they have waited stale_after
        seconds with no commit, or while the job commits others."""
        status, problem = "ok", ""
        if self.waiting_since is not None:
            waited = now - self.waiting_since
            n = max(0, acked_seq - self.committed_seq)
            path = self.committed_file
            fs = self._file_state
            job = commits.running_job(self.job_file) if fs != "ok" or waited > self.stale_after else None
            other = self._other_table(job)
            if other:
                status, problem = "other_table", other
            elif fs == "missing" and job is not None:    # a job that has not committed yet
                if waited > self.stale_after:
                    status, problem = "stale", (f"the history job (pid {job.get('pid')}) has not "
                                                f"committed anything yet ({path})")
            elif fs != "ok":
                status, problem = fs, {
                    "missing": f"no committed file {path} and no history job running with this "
                               "data directory (python -m sink.job --config <the broker's config>)",
                    "unreadable": f"the history job's committed file {path} cannot be read",
                    "unsigned": f"the committed file {path} is not signed: it is ignored (a job "
                                "started before the broker made its key signs its next commit)",
                    "bad_signature": f"the committed file {path} is signed with another key "
                                     "(forged, or a job using another data directory): it is ignored",
                }[fs]
            elif waited > self.stale_after:
                blocker = self._head_blocker(self.progress)
                if blocker and self._file_changed_at > self.waiting_since:
                    status, problem = "stalled", f"the history job commits, but {blocker}"
                elif now - self._file_changed_at > self.stale_after:
                    status, problem = "stale", (f"the history job has committed nothing for "
                                                f"{now - self._file_changed_at:.0f} s ({path})")
            if problem:
                problem += (f"; {n} records kept in the spool for {waited:.0f} s (at "
                            "spool_max_bytes QoS 1/2 publishers get 0x97)")
        self.status, self.problem = status, problem
        last, at = self._problem_logged
        if status != last or (status != "ok" and now - at > 600):
            if status != "ok":
                log.warning("records wait for the history table: %s", problem)
            elif last is not None and last != "ok":
                log.info("the history job's commits release spooled records again")
            self._problem_logged = (status, now)
