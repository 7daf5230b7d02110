"""One history replay, in a child process of the broker (sink/replay/hook.py starts it):

    python -m sink.replay.worker      (its settings: one JSON line on stdin)

The broker's event loop never reads Parquet or decodes Kafka: this process does, at its own
niceness, and streams the replay to the broker on stdout in frames (records.py) as fast as the
broker takes them - the broker reads the next frame only when its client has room, so a slow
client costs the pipe's buffer here and nothing in the broker. Lines on stdin after the first:
``{"sync": n}`` (answered by a ``("synced", n)`` marker: feed.py; one that comes while this
process is still starting is kept for the Kafka reading). It exits at the end of stdin (the
broker ended the replay, or is gone).

Order of the stream: the job's committed file is read, then a snapshot of the table is taken,
then Kafka is read from the committed offsets (tail.py) to the boundary; the table's rows of the
snapshot in the time range follow, in (accepted_at, partition, offset) order, without those
whose id Kafka had up to the boundary; a ``("table", n)`` marker; then Kafka's records from the
committed offsets on, for as long as the broker wants them.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import IO, TYPE_CHECKING, Iterable

import numpy as np

from .records import FRAME_BYTES, FRAME_ITEMS, TABLE_COLUMNS, frame, from_rows, item_size

if TYPE_CHECKING:
    from sink.history.dedup import Ledger

    from .tail import Tail

log = logging.getLogger(__spec__.name if __name__ == "__main__" else __name__)  # (python -m: its module path)


def known_mask(known: Ledger | None, ids: list) -> np.ndarray:
    """Which of ``ids`` (bytes) are in the ledger ``known`` (sink.history.dedup intervals)."""
    from sink.history.dedup import parse_ids
    if not ids or known is None or not len(known):
        return np.zeros(len(ids), bool)
    data = np.frombuffer(b"".join(ids), np.uint8)
    length = np.fromiter((len(i) for i in ids), np.int64, len(ids))
    start = np.zeros(len(ids), np.int64)
    np.cumsum(length[:-1], out=start[1:])
    group, seq, keys = parse_ids(data, start, length)
    out = np.zeros(len(ids), bool)
    for g, key in enumerate(keys):
        idx = np.flatnonzero(group == g)
        out[idx] = known.seen(key, seq[idx])
    return out


class Worker:
    def __init__(self, cfg: dict, out: IO[bytes]) -> None:
        self.cfg = cfg
        self.out = out
        self.lock = threading.Lock()
        self.tail: Tail | None = None
        # sync requests that came before the tail was made (the broker asks as soon as Kafka
        # has what it needs, which can be before this process has even read the table: a request
        # dropped then is never asked again, and the replay would never go live)
        self.early_syncs: list[int] = []
        self.sync_lock = threading.Lock()

    def emit(self, items: list) -> None:
        if items:
            with self.lock:
                self.out.write(frame(items))
                self.out.flush()

    def emit_all(self, items: list) -> None:
        chunk, size = [], 0
        for it in items:
            chunk.append(it)
            size += item_size(it)
            if len(chunk) >= FRAME_ITEMS or size >= FRAME_BYTES:
                self.emit(chunk)
                chunk, size = [], 0
        self.emit(chunk)

    def commands(self, stream: Iterable[bytes]) -> None:
        """stdin after the settings: sync requests, until its end."""
        for line in stream:
            try:
                cmd = json.loads(line)
            except ValueError:
                continue
            if "sync" in cmd:
                self.request_sync(int(cmd["sync"]))

    def request_sync(self, generation: int) -> None:
        """To the tail, or kept for it until it is made (attach())."""
        with self.sync_lock:
            if self.tail is None:
                self.early_syncs.append(generation)
            else:
                self.tail.request_sync(generation)

    def attach(self, tail: Tail) -> None:
        """The tail from now on, with the sync requests that came before it."""
        with self.sync_lock:
            self.tail = tail
            for g in self.early_syncs:
                tail.request_sync(g)
            self.early_syncs.clear()

    def run(self) -> None:
        from settings import secrets
        from sink.history.commits import read_committed
        from sink.history.manifest import Table
        from sink.history.reader import read_history

        from .tail import Tail
        c = self.cfg
        key = secrets.sink_key(c["data_dir"]) if c.get("data_dir") else None
        committed = read_committed(c["committed_file"],
                                   secrets.derive(key, secrets.COMMITTED) if key else None)
        if committed is not None and committed["signature"] not in ("ok", "unchecked"):
            log.warning("replay: %s is not signed with this broker's key (%s): ignored, Kafka is "
                        "read from its start", c["committed_file"], committed["signature"])
            committed = None
        table = Table(c["table"])
        snap = table.snapshot() if table.exists() else None   # after the committed file
        check = None
        if c.get("verify", True) and key is not None:
            from sink.history.verify import Verdicts
            check = (secrets.derive(key, secrets.RECORDS), secrets.key_id(key), Verdicts())
        tail = Tail(c["bootstrap"], c.get("kafka") or {}, c["topics"], committed, c["filter"],
                    c["since_ms"], c.get("until_ms"), c.get("max_bytes", 64 << 20), check)
        self.attach(tail)
        tail.start()
        tail.boundary.wait()
        if tail.failed:
            self.emit([("error", tail.failed)])
            return self.idle()
        n = 0
        if snap is not None and snap.files:
            for batch in read_history(c["table"], c["filter"], c["since_ms"], c.get("until_ms"),
                                      columns=TABLE_COLUMNS, snapshot=snap,
                                      max_bytes=c.get("table_buffer_bytes", 64 << 20)):
                items = from_rows(batch)
                skip = known_mask(tail.known, [it[0] for it in items])
                if skip.any():
                    items = [it for it, s in zip(items, skip, strict=True) if not s]
                n += len(items)
                self.emit_all(items)
        log.info("replay of %s: %d messages from the table (version %s), now Kafka", c["filter"],
                 n, snap.id if snap is not None else "none")
        self.emit([("table", n)])
        while True:
            items = tail.take(FRAME_ITEMS, FRAME_BYTES, 1.0)
            self.emit(items)
            if tail.failed and not items:
                return self.idle()

    def idle(self) -> None:
        """Said what went wrong: wait for the broker to end this process (stdin closes)."""
        threading.Event().wait()


def _commands(w: Worker, stdin: IO[bytes]) -> None:
    """The end of stdin ends this process (the broker ended the replay, or is gone)."""
    w.commands(stdin)
    os._exit(0)


def main() -> int:
    first = sys.stdin.buffer.readline()
    if not first:
        return 0
    cfg = json.loads(first)
    logging.basicConfig(level=cfg.get("log_level", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:  # (the broker set it at the start already: this keeps it, whoever started this)
        os.setpriority(os.PRIO_PROCESS, 0, max(int(cfg.get("nice", 10)),
                                               os.getpriority(os.PRIO_PROCESS, 0)))
    except OSError:
        pass
    w = Worker(cfg, sys.stdout.buffer)
    threading.Thread(target=_commands, args=(w, sys.stdin.buffer), name="replay-commands",
                     daemon=True).start()
    try:
        w.run()
    except BrokenPipeError:
        return 0
    except Exception as exc:
        log.exception("replay worker failed")
        try:
            w.emit([("error", f"{type(exc).__name__}: {exc}")])
        except OSError:
            return 1
        w.idle()
    return 0


if __name__ == "__main__":
    sys.exit(main())
