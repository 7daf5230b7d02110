"""Duplicate message ids, removed by the Python Kafka source with state that costs what it must.

Why not Spark's ``dropDuplicatesWithinWatermark``: it keeps one state row per id and scans all
of them on every micro-batch to evict the old ones, so its cost grows with rate x window
(bench/dedup_state.py: 0.2 s per batch at 0.2 M ids, 2.7 s at 6.2 M; a day at 25,000 msg/s is
2 billion ids). Here the state is what the ids' structure needs:

- The forwarder's ids are ``<prefix>-<n>``: a random prefix per broker run and Kafka topic, and
  a counter in lowercase hex. Per *group* (prefix, number of digits: "x-01" and "x-1" stay
  different ids) the ids seen so far are a few intervals of n: one per gap (a record lost to a
  disk error) plus the few ids still in flight between Kafka partitions at a batch boundary.
  Lookups are a binary search (numpy, whole batches at once); memory is O(groups + gaps).
- Groups not seen for ``window_ms`` (by micro-batch time) are dropped: a broker run that ended
  long ago. At most ``max_groups`` are kept (least recently seen dropped first), so ids made
  by other producers with a different prefix each cannot grow it without bound.
- Ids of another form (not ending in ``-<lowercase hex>``, at most 15 digits) and records
  without an id are never dropped.

Exactly once, with Spark's offset log (sink/history/source.py):
- The planning process keeps the *ledger*: the groups seen before a micro-batch. For a batch
  ``(start, end)`` it writes ``ledger-<key(start)>`` (key = hash of the offsets) and a manifest
  ``batch-<key(end)>/manifest.json`` naming the start, before any task runs.
- Each task drops ids found in the ledger or earlier in its own ranges (both copies of a
  message have the same Kafka key, so the same partition, so the same task), and writes the
  ids it kept as intervals to ``batch-<key(end)>/task-<ranges>.pkl`` (atomic, deterministic:
  a re-run writes the same file).
- Planning the next batch merges the previous batch's task files into the ledger. After a
  crash, Spark re-runs the logged batch with the same offsets: the ledger for its start is on
  disk (or rebuilt from the manifest chain), so the re-run drops the same records.
- Missing state (deleted files) means an empty ledger: duplicates may then pass, nothing is
  ever dropped that was not seen.
"""
from __future__ import annotations

import hashlib
import json
import logging
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np

from sink.history.commits import atomic_write

log = logging.getLogger(__name__)

DEFAULT_WINDOW_MS = 24 * 3600 * 1000
DEFAULT_MAX_GROUPS = 100_000
MAX_DIGITS = 15  # 60 bits: fits int64

_HEX = np.full(256, -1, np.int64)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_DASH = ord("-")


# ---- ids -> (group, n) ---------------------------------------------------------------------

def parse_ids(data: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple:
    """Ids ``data[start:start+length]`` (length -1: none) -> (group index per record, -1 when
    not of the form ``<prefix>-<hex>``; n per record; list of group keys (prefix, digits)).
    Vectorized: one pass per digit position, no Python object per record."""
    n_rec = len(start)
    end = start + length
    seq = np.zeros(n_rec, np.int64)
    digits = np.zeros(n_rec, np.int64)
    active = length >= 2                       # at least "-" and one digit
    last = len(data) - 1
    for k in range(1, MAX_DIGITS + 2):
        live = active & (k <= length)
        if not live.any():
            break
        c = data[np.clip(end - k, 0, last)]
        dash = live & (c == _DASH) & (k >= 2)
        digits[dash] = k - 1
        v = _HEX[c]
        more = live & ~dash & (v >= 0) & (k <= MAX_DIGITS)
        seq[more] += v[more] << (4 * (k - 1))
        active = more
    ours = digits > 0
    group = np.full(n_rec, -1, np.int64)
    keys: list = []
    todo = np.flatnonzero(ours)
    plen = length - digits - 1
    # Prefixes are few (one per broker run): find each one's records with a vectorized
    # comparison; only after many different ones fall back to a dict lookup per record.
    while len(todo) and len(keys) < 8:
        i0 = todo[0]
        a, n, dg = int(start[i0]), int(plen[i0]), int(digits[i0])
        prefix = data[a:a + n]
        same = todo[(plen[todo] == n) & (digits[todo] == dg)]
        if n:
            window = data[start[same, None] + np.arange(n, dtype=np.int64)]
            same = same[(window == prefix).all(axis=1)]
        group[same] = len(keys)
        keys.append((prefix.tobytes(), dg))
        todo = todo[group[todo] < 0]
    if len(todo):
        index = {k: g for g, k in enumerate(keys)}
        for i in todo:
            a = int(start[i])
            key = (data[a:a + int(plen[i])].tobytes(), int(digits[i]))
            g = index.get(key)
            if g is None:
                g = index[key] = len(keys)
                keys.append(key)
            group[i] = g
    return group, seq, keys


# ---- intervals -----------------------------------------------------------------------------

def to_intervals(values: np.ndarray) -> tuple:
    """Sorted unique int64 values -> (starts, ends) of their runs (ends inclusive)."""
    if len(values) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    brk = np.flatnonzero(np.diff(values) != 1)
    return (np.concatenate(([values[0]], values[brk + 1])),
            np.concatenate((values[brk], [values[-1]])))


def merge(a: tuple, b: tuple) -> tuple:
    """Union of two interval sets (each sorted, disjoint) -> sorted, disjoint, adjacent joined."""
    if len(a[0]) == 0:
        return b
    if len(b[0]) == 0:
        return a
    s = np.concatenate((a[0], b[0]))
    e = np.concatenate((a[1], b[1]))
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1] + 1
    first = np.flatnonzero(new)
    last = np.concatenate((first[1:] - 1, [len(s) - 1]))
    return s[first], reach[last]


def contains(iv: tuple, values: np.ndarray) -> np.ndarray:
    """Boolean mask: which values fall in one of the intervals."""
    starts, ends = iv
    if len(starts) == 0:
        return np.zeros(len(values), bool)
    i = np.searchsorted(starts, values, side="right") - 1
    return (i >= 0) & (values <= ends[np.maximum(i, 0)])


# ---- the ledger ----------------------------------------------------------------------------

class Ledger:
    """Per group: intervals of the ids seen, and the micro-batch time it was last seen."""

    def __init__(self, groups: "OrderedDict | None" = None) -> None:
        self.groups: OrderedDict = groups if groups is not None else OrderedDict()

    def __len__(self) -> int:
        return len(self.groups)

    def intervals(self) -> int:
        return sum(len(v[0]) for v in self.groups.values())

    def seen(self, key: tuple[bytes, int], values: np.ndarray) -> np.ndarray:
        g = self.groups.get(key)
        return contains(g[:2], values) if g is not None else np.zeros(len(values), bool)

    def add(self, key: tuple[bytes, int], iv: tuple, ms: int = 0) -> None:
        g = self.groups.pop(key, None)
        s, e = merge((g[0], g[1]), iv) if g is not None else iv
        self.groups[key] = (s, e, max(ms, g[2] if g is not None else 0))  # most recent last

    def expire(self, now_ms: int, window_ms: int, max_groups: int) -> int:
        """Drop groups last seen before now - window, then the least recent beyond max_groups.
        Touches only what it drops (the dict is ordered by last use)."""
        dropped = 0
        while self.groups:
            key, g = next(iter(self.groups.items()))
            if g[2] >= now_ms - window_ms and len(self.groups) <= max_groups:
                break
            del self.groups[key]
            dropped += 1
        return dropped

    def dumps(self) -> bytes:
        return pickle.dumps([(k, v) for k, v in self.groups.items()], protocol=5)

    @classmethod
    def loads(cls, raw: bytes) -> "Ledger":
        return cls(OrderedDict(pickle.loads(raw)))


class TaskFilter:
    """One Spark task: drops ids already in the ledger or earlier in this task, and collects
    the ids it kept (the task's summary)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.kept = Ledger()
        self.dropped = 0

    def keep(self, data: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Mask over the records of one fetch: True = first time this id is seen."""
        group, seq, keys = parse_ids(data, start, length)
        keep = np.ones(len(group), bool)
        for g, key in enumerate(keys):
            idx = np.flatnonzero(group == g)
            vals = seq[idx]
            # first occurrence of each value within this fetch
            uniq, first = np.unique(vals, return_index=True)
            dup = np.ones(len(idx), bool)
            dup[first] = False
            old = self.ledger.seen(key, uniq) | self.kept.seen(key, uniq)
            dup[first[old]] = True
            keep[idx[dup]] = False
            fresh = uniq[~old]
            if len(fresh):
                self.kept.add(key, to_intervals(fresh))
        self.dropped += int((~keep).sum())
        return keep

    def summary(self) -> dict:
        return {k: (v[0], v[1]) for k, v in self.kept.groups.items()}


# ---- files (the planning side) -------------------------------------------------------------

def offsets_key(offsets: dict) -> str:
    """A name for a micro-batch boundary: hash of its offsets (topic ids and positions)."""
    core = {"t": offsets.get("t", {}), "ids": offsets.get("ids", {})}
    return hashlib.sha1(json.dumps(core, sort_keys=True).encode()).hexdigest()[:20]


def write_task_summary(batch_dir: str, task: str, summary: dict) -> None:
    d = Path(batch_dir)
    d.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha1(task.encode()).hexdigest()[:16]
    atomic_write(d / f"task-{name}.pkl", pickle.dumps(summary, protocol=5))


_loaded: dict = {}


def load_ledger(path: str) -> Ledger:
    """The ledger file a task filters against (kept per worker process: tasks of one batch
    on a reused worker read it once)."""
    led = _loaded.get(path)
    if led is None:
        led = Ledger.loads(Path(path).read_bytes())
        _loaded.clear()
        _loaded[path] = led
    return led


class LedgerStore:
    """The planning process's side: ledger files and batch manifests under ``directory``."""

    def __init__(self, directory: str, window_ms: int = DEFAULT_WINDOW_MS,
                 max_groups: int = DEFAULT_MAX_GROUPS) -> None:
        self.dir = Path(directory)
        self.window_ms = window_ms
        self.max_groups = max_groups
        self._key: str | None = None
        self._ledger: Ledger | None = None
        self._warned_full = False

    def ledger_path(self, key: str) -> Path:
        return self.dir / f"ledger-{key}.pkl"

    def batch_dir(self, key: str) -> Path:
        return self.dir / f"batch-{key}"

    def prepare(self, start: dict, end: dict, ts_ms: int) -> tuple[str, str]:
        """Before the batch (start, end) runs: (ledger file for its tasks, their batch dir)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        sk, ek = offsets_key(start), offsets_key(end)
        ledger = self._ledger_for(sk)
        path = self.ledger_path(sk)
        if not path.exists():
            atomic_write(path, ledger.dumps())
        bdir = self.batch_dir(ek)
        bdir.mkdir(exist_ok=True)
        manifest = bdir / "manifest.json"
        if not manifest.exists():
            atomic_write(manifest, json.dumps({"start": sk, "ts": ts_ms}).encode())
        self._cleanup(keep_ledger=path.name, keep_batch=bdir.name)
        return str(path), str(bdir)

    def _ledger_for(self, key: str, depth: int = 0) -> Ledger:
        if self._key == key and self._ledger is not None:
            return self._ledger
        path = self.ledger_path(key)
        bdir = self.batch_dir(key)
        if path.exists():
            ledger = Ledger.loads(path.read_bytes())
        elif (bdir / "manifest.json").exists() and depth < 1000:
            meta = json.loads((bdir / "manifest.json").read_text())
            ledger = self._ledger_for(meta["start"], depth + 1)
            ledger = Ledger(OrderedDict(ledger.groups))  # never change a cached one in place
            self._merge_batch(ledger, bdir, int(meta.get("ts", 0)))
        else:
            if any(self.dir.glob("ledger-*.pkl")):
                log.warning("no de-duplication state for these offsets in %s: starting empty "
                            "(duplicates read in this batch may pass)", self.dir)
            ledger = Ledger()
        self._key, self._ledger = key, ledger
        return ledger

    def _merge_batch(self, ledger: Ledger, bdir: Path, ts_ms: int) -> None:
        for f in sorted(bdir.glob("task-*.pkl")):
            for key, iv in pickle.loads(f.read_bytes()).items():
                ledger.add(key, iv, ts_ms)
        before = len(ledger)
        dropped = ledger.expire(ts_ms, self.window_ms, self.max_groups)
        if dropped and before > self.max_groups and not self._warned_full:
            self._warned_full = True
            log.warning("de-duplication: more than %d id prefixes seen (ids not written by this "
                        "project's forwarder?); the least recently seen are forgotten",
                        self.max_groups)

    def _cleanup(self, keep_ledger: str, keep_batch: str) -> None:
        """Only the ledger of the running batch and its batch dir are needed from now on."""
        for p in self.dir.iterdir():
            if p.name in (keep_ledger, keep_batch):
                continue
            try:
                if p.is_dir():
                    for f in p.iterdir():
                        f.unlink()
                    p.rmdir()
                elif p.name.startswith("ledger-"):
                    p.unlink()
            except OSError:
                pass
