"""State that survives restarts, in SQLite (standard library, one file, WAL journal).

What is stored: persistent sessions (Session Expiry Interval > 0, or 3.1.1 clean
session 0) with their subscriptions, queued and in-flight outbound QoS messages
(packet identifiers and PUBREL state), inbound QoS 2 packet identifiers awaiting
PUBREL, the will; and every retained message. Clean sessions live in memory only.

Writes are batched: the core appends operations as it changes state and the server
commits them in one transaction at the end of an event-loop turn, before the turn's packets
(PUBACK, PUBREC, ...) are written. With `synchronous = NORMAL` a commit reaches the
OS before any acknowledgement, so a SIGKILL loses nothing acknowledged; `FULL` also
fsyncs for power loss, at a cost.

Three kinds of change wait for a later commit instead of forcing one at the end of their turn
(each commit costs 25-35 us: one per turn was a third of the broker's CPU in a reconnect storm,
bench/storm.py): a connected session's own row (written at CONNECT), a queued QoS 1 message
being sent (its packet id) and a QoS 1 delivery acknowledged (the row deleted). They go with
the next commit, which comes at the latest after LAZY_MAX_OPS changes or at the next tick (one
second). Nothing acknowledged depends on them: a broker killed in that second restores the
session as it was stored before the CONNECT and sends such QoS 1 messages again (QoS 1 is
at least once). What QoS 0 and QoS 2 deliveries depend on (at most / exactly once), offline
sessions' rows, subscriptions, retained messages and every change an acknowledgement waits for
are committed in their turn, as before.

A damaged or truncated file never stops the broker: it is moved aside, every row
that can still be read is recovered into a fresh file, and the log says what was dropped.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..core.durability import Pending
from ..core.hooks import SESSION_EVENTS, STORED_EVENTS, Hook
from ..core.message import Message, publish_problem
from ..core.session import Session, Subscription
from ..protocol import packets as P
from ..protocol.properties import decode_properties, encode_properties

if TYPE_CHECKING:
    from ..core.hookhost import HookHost

Row = tuple[Any, ...]   # (rowid, *columns) of a table

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, topic TEXT NOT NULL, payload BLOB,
    qos INTEGER, retain INTEGER, props BLOB, expires_at REAL, accepted_at REAL, crc INTEGER);
CREATE TABLE IF NOT EXISTS sessions (client_id TEXT PRIMARY KEY, expiry_interval INTEGER,
    expires_at REAL, username TEXT, will BLOB, next_pid INTEGER);
CREATE TABLE IF NOT EXISTS subscriptions (client_id TEXT, filter TEXT, qos INTEGER, no_local INTEGER,
    rap INTEGER, rh INTEGER, sub_id INTEGER, PRIMARY KEY (client_id, filter));
CREATE TABLE IF NOT EXISTS outbound (seq INTEGER PRIMARY KEY, client_id TEXT, msg_id INTEGER,
    qos INTEGER, retain INTEGER, sub_ids TEXT, pid INTEGER, released INTEGER DEFAULT 0);
CREATE TABLE IF NOT EXISTS qos2_in (client_id TEXT, pid INTEGER, PRIMARY KEY (client_id, pid));
CREATE TABLE IF NOT EXISTS retained (topic TEXT PRIMARY KEY, msg_id INTEGER);
CREATE INDEX IF NOT EXISTS outbound_client ON outbound (client_id);
"""

_INS_MSG = "INSERT INTO messages VALUES (?,?,?,?,?,?,?,?,?)"
_INS_OUT = "INSERT INTO outbound VALUES (?,?,?,?,?,?,?,0)"
_DEL_OUT = "DELETE FROM outbound WHERE seq=?"
DISK_ERROR = "the message could not be stored (broker disk error)"
RETRY_FIRST, RETRY_MAX = 0.25, 5.0  # seconds between commit retries while the disk fails
_TABLES = ("messages", "sessions", "subscriptions", "outbound", "qos2_in", "retained")
LAZY_MAX_OPS = 2000  # changes that may wait for a later commit (see the module's text): ~6 ms


def _crc(topic: str, payload: bytes, props: bytes | None) -> int:
    """Checksum of a stored message: a damaged file (e.g. truncated) can read back a payload
    whose overflow pages are zeros without any error from SQLite; such a row is dropped."""
    return zlib.crc32(props or b"", zlib.crc32(payload, zlib.crc32(topic.encode())))


def _add_crc_column(db: sqlite3.Connection) -> None:
    """Files written before messages had a checksum: add the column (old rows keep NULL)."""
    if "crc" not in {r[1] for r in db.execute("PRAGMA table_info(messages)")}:
        db.execute("ALTER TABLE messages ADD COLUMN crc INTEGER")


def _ids(sub_ids: Iterable[int] | None) -> str | None:
    return ",".join(map(str, sub_ids)) if sub_ids else None


class Store(Hook):
    """The persistence hook: persistent sessions' state and retained messages, in SQLite.
    Its hook events are its own operations (see the aliases at the end of the class); the
    server commits them (commit()) once per event-loop turn."""
    provides = frozenset(SESSION_EVENTS + STORED_EVENTS + ("on_retain", "barrier", "on_start",
                                                           "on_turn_end", "on_tick", "on_stop"))

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, synchronous: str = "NORMAL",
                 max_pending: int = 1_000_000) -> None:
        self.path = path
        self.clock = clock
        self.wall = wall
        self.synchronous = synchronous
        self.ops: list = []   # pending changes; the same list for the store's life (cleared in place)
        self.failing = 0      # consecutive failed commits (0: healthy)
        self.max_pending = max_pending  # changes kept while commits fail; beyond: rewrite later
        self.resync = False   # changes were dropped: the next commit rewrites the whole state
        self.broker: HookHost | None = None  # set when attached to a broker: the state a rewrite writes
        self.retry_at = 0.0   # clock() before which a failing store does not try again
        self.turn: Pending | None = None  # what acks of this turn's changes wait for (barrier)
        self.marked = 0       # len(ops) at the last barrier() or commit: later ones are new
        self.urgent = False   # ops holds a change that must be committed at the end of its turn
        # stored copies of QoS 0 and QoS 2 messages: sending and removing them is urgent (their
        # duplicates matter); QoS 1 ones (most) are not tracked
        self.exact: set[int] = set()
        self.ticks = 0
        self.db = self._open()
        self.seq = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM outbound").fetchone()[0]
        self.msg_seq = self.db.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0]
        self.dropped: dict[str, int] = {}      # table -> rows skipped at load (unreadable)
        self.skipped: dict[str, list] = {}     # table -> unreadable parts (after, to, error)
        self._first_drop: dict[str, str] = {}

    # ------------------------------------------------------------ opening / recovery
    def _connect(self, path: str) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self.synchronous}")
        return db

    def _open(self) -> sqlite3.Connection:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self.salvaged = None
        try:
            db = self._connect(self.path)
            ok = db.execute("PRAGMA quick_check").fetchone()[0]
            if ok != "ok":
                raise sqlite3.DatabaseError(ok)
            db.executescript(SCHEMA)
            _add_crc_column(db)
            return db
        except sqlite3.DatabaseError as exc:
            try:
                db.close()
            except Exception:
                pass
            aside = f"{self.path}.damaged-{int(time.time())}"
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(self.path + suffix):
                    os.replace(self.path + suffix, aside + suffix)
            log.error("state store %s is damaged (%s): moved to %s; recovering what can be read",
                      self.path, exc, aside)
            self.salvaged = aside
            db = self._connect(self.path)
            db.executescript(SCHEMA)
            _add_crc_column(db)
            return db

    def _rows(self, db: sqlite3.Connection, table: str) -> Iterator[Row]:
        """(rowid, *columns) of every row of `table` that can still be read, in rowid order.

        Read in rowid ranges: where a range is unreadable (a damaged or missing page) the rows
        before the damage are read one by one, then the next readable rowid is probed for, so
        a bad page costs only its own rows. Skipped ranges are counted for the log."""
        sql = f"SELECT rowid, * FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT ?"
        last, chunk = _MIN_ROWID, _CHUNK
        while True:
            try:
                rows = _fetch(db, sql, last, chunk)
            except sqlite3.DatabaseError as exc:
                if chunk > 1:
                    chunk = 1  # read up to the damage row by row
                    continue
                nxt = _readable_after(db, sql, last)
                self.skipped.setdefault(table, []).append(
                    (None if last == _MIN_ROWID else last, nxt, str(exc)))
                if nxt is None:
                    return
                last, chunk = nxt, _CHUNK
                continue
            if not rows:
                return
            yield from rows
            last = rows[-1][0]

    # ------------------------------------------------------------ restore
    def load(self, broker: HookHost) -> dict[str, Any]:
        """Rebuild sessions, subscriptions, queues, in-flight state and retained messages.

        Row by row for every table: a row that cannot be read or has wrong types is skipped
        and counted, and so is an unreadable part of a damaged file; the log says what."""
        t0 = time.perf_counter()
        if not broker.has_hook(self):
            broker.add_hook(self)  # restored sessions report their changes to this store
        src = self.db
        if self.salvaged:
            try:
                src = sqlite3.connect(self.salvaged)
                # a truncated file: read the pages that are there instead of refusing it all
                src.execute("PRAGMA writable_schema=ON")
            except sqlite3.DatabaseError as exc:
                log.error("state store: nothing recoverable in %s: %s", self.salvaged, exc)
                return {}
        now, wall = self.clock(), self.wall()
        messages: dict[int, Message] = {}
        restored: dict[str, int] = {}

        def restore(table: str, check: Callable[[Row], bool], apply: Callable[..., None]) -> None:
            """apply(columns) to every readable row; a row that fails is dropped and counted."""
            n = 0
            for row in self._rows(src, table):
                try:
                    if not check(row):
                        raise TypeError("unexpected types "
                                        f"{tuple(type(v).__name__ for v in row[1:])}")
                    apply(*row[1:])
                    n += 1
                except Exception as exc:
                    self._drop(table, row[0], exc)
            restored[table] = n

        def message(mid: int, topic: str, payload: bytes | None, qos: int, retain: int,
                    props: bytes | None, expires_at: float | None, accepted: float,
                    crc: int | None = None) -> None:
            if crc is not None and crc != _crc(topic, payload or b"", props):
                raise ValueError("checksum mismatch: the row's content is damaged")
            pr = decode_properties(props, 0, "PUBLISH")[0] if props else None
            # what a PUBLISH is held to: a row written by hand, by an older broker or damaged
            # must not reach subscribers as a packet they cannot read (the protocol's limits,
            # not this config's: a stored message is not lost to a lowered limit)
            problem = publish_problem(topic, payload or b"", pr)
            if problem is not None:
                raise ValueError(f"not a message MQTT can carry: {problem}")
            exp = None if expires_at is None else now + (expires_at - wall)
            m = Message(topic, bytes(payload or b""), qos, bool(retain), pr, exp, None, accepted)
            m.store_id = mid
            messages[mid] = m

        def session(cid: str, interval: int, expires_at: float | None, username: str | None,
                    will: bytes | None, next_pid: int | None) -> None:
            w = decode_will(will) if will else None
            problem = w is not None and publish_problem(w.topic, w.payload, w.properties)
            if problem:  # a will MQTT could not carry is not published: the session stays
                log.warning("state store: the will of session %r is dropped: %s", cid, problem)
                w = None
            broker.restore_session(cid, interval, expires_at, username, w, next_pid)  # type: ignore[arg-type]  # None: 1

        def subscription(cid: str, filt: str, qos: int, no_local: int | None, rap: int | None,
                         rh: int, sub_id: int | None) -> None:
            broker.restore_subscription(cid, filt, qos, bool(no_local), bool(rap), rh, sub_id)

        def outbound(seq: int, cid: str, mid: int, qos: int, retain: int, ids: str | None,
                     pid: int | None, released: int | None) -> None:
            m = messages.get(mid)
            if m is not None:
                sub_ids = tuple(int(x) for x in ids.split(",")) if ids else None
                if broker.restore_outbound(cid, m, qos, bool(retain), sub_ids, pid,
                                           bool(released), seq) and qos != 1:
                    self.exact.add(seq)

        nret = 0

        def retained(topic: str, mid: int) -> None:
            nonlocal nret
            m = messages.get(mid)
            if m is not None and m.topic != topic:
                raise ValueError(f"retained topic {topic!r} is not its message's {m.topic!r}")
            if m is not None and broker.restore_retained(m):
                nret += 1

        restore("messages", _ok_message, message)
        restore("sessions", _ok_session, session)
        restore("subscriptions", _ok_subscription, subscription)
        restore("outbound", _ok_outbound, outbound)
        restore("qos2_in", _ok_qos2, broker.restore_qos2)
        restore("retained", _ok_retained, retained)
        self._report(restored)
        if self.salvaged:
            src.close()
            for m in messages.values():
                m.store_id = None  # ids of the old file: the fresh one gets every message anew
            self.snapshot(broker)
        nsessions = len(broker.every_session())
        summary = {"sessions": nsessions, "retained": nret, "messages": len(messages),
                   "seconds": round(time.perf_counter() - t0, 3), "dropped": dict(self.dropped),
                   "skipped": {t: len(v) for t, v in self.skipped.items()}}
        log.info("restored %d sessions, %d retained messages, %d stored messages in %.3fs%s",
                 nsessions, nret, len(messages), summary["seconds"],
                 f"; dropped unreadable rows: {self.dropped}" if self.dropped else "")
        broker.restored()
        return summary

    def _drop(self, table: str, rowid: int, exc: Exception) -> None:
        self.dropped[table] = self.dropped.get(table, 0) + 1
        if self.dropped[table] <= 3:  # the first few in detail, then the count per table
            log.debug("state store: dropped %s row %s: %s", table, rowid, exc)
        self._first_drop.setdefault(table, f"row {rowid}: {exc}")

    def _report(self, restored: dict) -> None:
        """One WARNING per table that lost something: how many rows, which parts, why."""
        for table, n in restored.items():
            bad, parts = self.dropped.get(table, 0), self.skipped.get(table, [])
            if not bad and not parts:
                continue
            what = []
            if bad:
                what.append(f"dropped {bad} unreadable rows (first: {self._first_drop[table]})")
            if parts:
                spans = ", ".join(f"after rowid {a if a is not None else 'start'} "
                                  f"{'to ' + str(b) if b is not None else 'to the end'}"
                                  for a, b, _ in parts[:5])
                what.append(f"skipped {len(parts)} unreadable parts ({spans}; {parts[0][2]})")
            log.warning("state store: table %s: restored %d rows, %s", table, n, "; ".join(what))

    def snapshot(self, broker: HookHost, rewrite: bool = False) -> int:
        """Write the whole in-memory state: after recovering from a damaged file, or (rewrite)
        replacing everything in the file after changes had to be dropped. Returns commit()'s."""
        self.ops.clear()
        self.exact.clear()  # every stored copy is written anew below
        if rewrite:
            self.ops.extend((f"DELETE FROM {t}", ()) for t in _TABLES)
            for s in broker.every_session():
                for e in s.queue:
                    e[0].store_id = None  # every message is written anew
                for f in s.inflight_out.values():
                    f.msg.store_id = None
            for m in broker.every_retained():
                m.store_id = None
        for s in broker.every_session():
            if s.store is None:
                continue
            self.save_session(s)
            for sub in s.subscriptions.values():
                self.save_subscription(s.client_id, sub)
            for i, (m, qos, retain, ids, _seq) in enumerate(list(s.queue)):
                s.queue[i] = (m, qos, retain, ids, self.enqueue(s.client_id, m, qos, retain, ids))
            for pid, f in s.inflight_out.items():
                f.handle = self.enqueue(s.client_id, f.msg, f.qos, f.retain, f.sub_ids, pid)
                if f.released:
                    self.set_released(f.handle)
            for pid in s.inflight_in:
                self.qos2_add(s.client_id, pid)
        for m in broker.every_retained():
            self.retain_set(m.topic, m)
        return self._write(self.ops)

    # ------------------------------------------------------------ changes (batched)
    def _message_id(self, msg: Message) -> int:
        mid = msg.store_id
        if not isinstance(mid, int):  # None: not written yet (a tuple is the cluster's, never here)
            self.msg_seq += 1
            mid = msg.store_id = self.msg_seq
            exp = None if msg.expires_at is None else self.wall() + (msg.expires_at - self.clock())
            props = encode_properties(msg.props) if msg.props else None
            self.ops.append((_INS_MSG, (mid, msg.topic, msg.payload, msg.qos, int(msg.retain),
                                        props, exp, msg.accepted_at,
                                        _crc(msg.topic, msg.payload, props))))
        return mid

    def enqueue(self, client_id: str, msg: Message, qos: int, retain: bool, sub_ids: Iterable[int] | None,
                pid: int | None = None) -> int:
        mid = self._message_id(msg)
        self.seq += 1
        self.ops.append((_INS_OUT, (self.seq, client_id, mid, qos, int(retain), _ids(sub_ids), pid)))
        self.urgent = True
        if qos != 1:
            self.exact.add(self.seq)
        return self.seq

    def set_pid(self, seq: int, pid: int) -> None:
        self.ops.append(("UPDATE outbound SET pid=? WHERE seq=?", (pid, seq)))
        if seq in self.exact:  # (QoS 1: lazy)
            self.urgent = True

    def set_released(self, seq: int) -> None:
        self.ops.append(("UPDATE outbound SET released=1 WHERE seq=?", (seq,)))
        self.urgent = True

    def remove(self, seq: int) -> None:
        self.ops.append((_DEL_OUT, (seq,)))
        if seq in self.exact:  # (QoS 1: lazy)
            self.exact.discard(seq)
            self.urgent = True

    def qos2_add(self, client_id: str, pid: int) -> None:
        self.ops.append(("INSERT OR REPLACE INTO qos2_in VALUES (?,?)", (client_id, pid)))
        self.urgent = True

    def qos2_remove(self, client_id: str, pid: int) -> None:
        self.ops.append(("DELETE FROM qos2_in WHERE client_id=? AND pid=?", (client_id, pid)))
        self.urgent = True

    def save_session(self, s: Session) -> None:
        exp = None if s.expires_at is None else self.wall() + (s.expires_at - self.clock())
        self.ops.append(("INSERT OR REPLACE INTO sessions VALUES (?,?,?,?,?,?)",
                         (s.client_id, s.expiry_interval, exp, s.username,
                          encode_will(s.will) if s.will else None, s.next_pid)))
        if s.connection is None:  # offline (a disconnect, a will gone): urgent; connected: lazy
            self.urgent = True

    def delete_session(self, client_id: str) -> None:
        self.urgent = True
        for sql in ("DELETE FROM sessions WHERE client_id=?", "DELETE FROM subscriptions WHERE client_id=?",
                    "DELETE FROM outbound WHERE client_id=?", "DELETE FROM qos2_in WHERE client_id=?"):
            self.ops.append((sql, (client_id,)))

    def save_subscription(self, client_id: str, sub: Subscription) -> None:
        self.urgent = True
        self.ops.append(("INSERT OR REPLACE INTO subscriptions VALUES (?,?,?,?,?,?,?)",
                         (client_id, sub.filter, sub.qos, int(sub.no_local),
                          int(sub.retain_as_published), sub.retain_handling, sub.sub_id)))

    def delete_subscription(self, client_id: str, filt: str) -> None:
        self.urgent = True
        self.ops.append(("DELETE FROM subscriptions WHERE client_id=? AND filter=?", (client_id, filt)))

    def retain_set(self, topic: str, msg: Message | None) -> None:
        self.urgent = True
        if msg is None:
            self.ops.append(("DELETE FROM retained WHERE topic=?", (topic,)))
        else:
            self.ops.append(("INSERT OR REPLACE INTO retained VALUES (?,?)", (topic, self._message_id(msg))))

    def commit(self) -> int:
        """Apply the pending operations in one transaction; returns how many, or -1 when they
        could not be written (disk full, I/O error): then they stay pending and are retried,
        with a growing delay, by the next commit; the caller fails what depended on them."""
        if self.resync:
            return self._rewrite()
        ops = self.ops
        if not ops:
            return 0
        if self.failing and self.clock() < self.retry_at:
            return -1
        return self._write(ops)

    def _write(self, ops: list) -> int:
        db = self.db
        try:
            db.execute("BEGIN")
            i, n = 0, len(ops)
            while i < n:  # consecutive identical statements go through executemany
                sql = ops[i][0]
                j = i + 1
                while j < n and ops[j][0] is sql:
                    j += 1
                if j - i > 1:
                    db.executemany(sql, [o[1] for o in ops[i:j]])
                else:
                    db.execute(sql, ops[i][1])
                i = j
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._commit_failed(exc, ops)
            return -1
        self.ops.clear()
        self.urgent = False
        if self.failing:
            log.info("state store: writes to %s succeed again (%d changes kept in memory were "
                     "written%s)", self.path, n, ": the whole state" if self.resync else "")
            self.failing = 0
        self.resync = False
        return n

    def _rewrite(self) -> int:
        """Changes were dropped: replace the file's content by the whole in-memory state."""
        if len(self.ops) > self.max_pending:
            self.ops.clear()  # superseded by the rewrite: kept bounded meanwhile
        if self.clock() < self.retry_at or self.broker is None:
            return -1
        return self.snapshot(self.broker, rewrite=True)

    def _commit_failed(self, exc: sqlite3.Error, ops: list) -> None:
        try:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        self.failing += 1
        delay = min(RETRY_MAX, RETRY_FIRST * 2 ** (self.failing - 1))
        self.retry_at = self.clock() + delay
        if self.failing == 1:
            log.error("state store: cannot write %s: %s. Acknowledgements that need the store "
                      "fail (MQTT 5: 0x80; 3.1.x: disconnected) until it can: free disk space or "
                      "fix the device; the changes are kept in memory and retried", self.path, exc)
        else:
            log.debug("state store: commit of %d changes failed again (retry in %.1fs): %s",
                      len(ops), delay, exc)
        # a statement SQLite refuses (not the disk) or too many changes waiting: drop them and
        # write the whole state once writes succeed
        if not self.resync and (not isinstance(exc, sqlite3.OperationalError)
                                or len(ops) > self.max_pending):
            log.error("state store: dropped %d pending changes (%s); the whole state will be "
                      "rewritten when writes succeed (persistence.max_pending_changes = %d)",
                      len(ops), exc, self.max_pending)
            self.resync = True
        if self.resync:
            self.ops.clear()

    def collect_garbage(self) -> None:
        """Delete stored messages nothing refers to any more."""
        if self.commit() < 0:
            return
        try:
            self.db.execute("DELETE FROM messages WHERE id NOT IN (SELECT msg_id FROM outbound) "
                            "AND id NOT IN (SELECT msg_id FROM retained)")
            # the QoS 0 / 2 copies of sessions that ended (deleted by client id) leave the set
            self.exact = {r[0] for r in self.db.execute("SELECT seq FROM outbound WHERE qos != 1")}
        except sqlite3.OperationalError as exc:
            log.warning("state store: garbage collection failed (retried later): %s", exc)

    def close(self) -> None:
        self.retry_at = 0.0  # a last try
        if self.commit() < 0:
            log.error("state store: the last changes could not be written to %s at shutdown",
                      self.path)
        self.collect_garbage()
        self.db.close()

    # ------------------------------------------------------------ the hook (core/hooks.py)
    def attach(self, broker: HookHost) -> None:
        self.broker = broker

    def barrier(self) -> Pending | None:
        """Acks of what changed stored state wait for this turn's commit (on_turn_end): asked
        after each read with acks, a token only if that read added changes (so while the disk
        fails, acks of messages that changed nothing stored still succeed)."""
        n = len(self.ops)
        added = n > self.marked
        self.marked = n
        if not added:
            return None
        if self.turn is None:
            self.turn = Pending()
        return self.turn

    def on_turn_end(self, force: bool = False) -> None:
        """Commit the turn's changes before its acknowledgements are written; if that fails,
        the acks waiting for it become failures (the changes are kept and retried). Changes
        that may wait (the module's text) are committed with a later turn's, by the tick
        (`force`) or once LAZY_MAX_OPS wait."""
        turn, self.turn = self.turn, None
        ops = self.ops
        if turn is not None or self.urgent or self.resync or force or len(ops) >= LAZY_MAX_OPS:
            ok = self.commit() >= 0 if ops or self.resync else True
        else:
            ok = True
        self.marked = len(ops)  # what a failed commit keeps is not a later read's change
        if turn is not None:
            turn.resolve(None if ok else DISK_ERROR)

    def on_tick(self) -> None:
        self.on_turn_end(force=True)
        self.ticks += 1
        if self.ticks % 60 == 0:
            self.collect_garbage()

    def on_start(self) -> None:
        assert self.broker is not None, "a hook is attached before the broker starts"
        self.load(self.broker)

    def on_stop(self) -> None:
        self.close()

    # (the hook events are called positionally: their parameters' names may differ)
    on_session_saved = save_session  # type: ignore[assignment]
    on_session_deleted = delete_session
    on_subscribed = save_subscription
    on_unsubscribed = delete_subscription
    on_qos2_received = qos2_add
    on_qos2_released = qos2_remove
    on_message_stored = enqueue
    on_stored_sending = set_pid  # type: ignore[assignment]
    on_stored_released = set_released  # type: ignore[assignment]
    on_stored_done = remove  # type: ignore[assignment]
    on_retain = retain_set


# Row checks at load: the types each column must have (anything else is a damaged row).
_MIN_ROWID, _MAX_ROWID, _CHUNK = -(1 << 63), (1 << 63) - 1, 500


def _fetch(db: sqlite3.Connection, sql: str, after: int, n: int) -> list[Row]:
    """Up to n rows with rowid > after; a damaged page shows as an error or rowids out of order."""
    rows = db.execute(sql, (after, n)).fetchall()
    prev = after
    for r in rows:
        if not isinstance(r[0], int) or r[0] <= prev:
            raise sqlite3.DatabaseError("rowids out of order (damaged page)")
        prev = r[0]
    return rows


def _readable_after(db: sqlite3.Connection, sql: str, bad: int) -> int | None:
    """The smallest x > bad from which rows after x can be read again (None: nothing)."""
    def ok(x: int) -> bool:
        try:
            _fetch(db, sql, x, 1)
            return True
        except sqlite3.DatabaseError:
            return False
    step, lo = 1, bad  # lo: known unreadable
    while True:
        hi = min(bad + step, _MAX_ROWID)
        if ok(hi):
            break
        if hi == _MAX_ROWID:
            return None
        lo, step = hi, step * 2
    while hi - lo > 1:  # bisect: the damaged range ends between lo and hi
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


# The checks run for every row at start (20,000 sessions: 100,000 rows): written out with type()
# tests rather than helper calls, half the time (SQLite returns exactly int, float, str, bytes)
_QOS = (0, 1, 2)
_NUMS = (int, float)


def _opt(v: object, t: type | tuple[type, ...]) -> bool:
    return v is None or isinstance(v, t)


def _text(v: object) -> bool:
    return type(v) is str and "\x00" not in v  # [MQTT-1.5.4-2]: no U+0000 in MQTT strings


def _topic(v: object) -> bool:
    return type(v) is str and v != "" and "\x00" not in v and "+" not in v and "#" not in v


def _ok_message(r: Row) -> bool:
    _, mid, topic, payload, qos, retain, props, expires, accepted, *crc = r
    return (type(mid) is int and type(topic) is str and topic != "" and "\x00" not in topic
            and "+" not in topic and "#" not in topic and (payload is None or type(payload) is bytes)
            and qos in _QOS and (retain is None or type(retain) is int)
            and (props is None or type(props) is bytes)
            and (expires is None or type(expires) in _NUMS) and type(accepted) in _NUMS
            and (not crc or crc[0] is None or type(crc[0]) is int))


def _ok_session(r: Row) -> bool:
    _, cid, interval, expires, user, will, next_pid = r
    return (type(cid) is str and "\x00" not in cid and type(interval) is int
            and (expires is None or type(expires) in _NUMS) and (user is None or type(user) is str)
            and (will is None or type(will) is bytes) and (next_pid is None or type(next_pid) is int))


def _ok_subscription(r: Row) -> bool:
    _, cid, filt, qos, no_local, rap, rh, sub_id = r
    return (type(cid) is str and type(filt) is str and "\x00" not in cid and "\x00" not in filt
            and qos in _QOS and (no_local is None or type(no_local) is int)
            and (rap is None or type(rap) is int) and rh in _QOS
            and (sub_id is None or type(sub_id) is int))


def _ok_outbound(r: Row) -> bool:
    _, seq, cid, mid, qos, retain, ids, pid, released = r
    return (type(seq) is int and type(cid) is str and type(mid) is int and qos in _QOS
            and (retain is None or type(retain) is int) and (ids is None or type(ids) is str)
            and (pid is None or type(pid) is int) and (released is None or type(released) is int))


def _ok_qos2(r: Row) -> bool:
    return isinstance(r[1], str) and isinstance(r[2], int)


def _ok_retained(r: Row) -> bool:
    return _topic(r[1]) and isinstance(r[2], int)


def encode_will(w: P.Will) -> bytes:
    from ..protocol.codec import encode
    # stored as a CONNECT packet of a dummy client carrying only the will
    return encode(P.Connect("w", P.MQTT_5, will=w), P.MQTT_5)


def decode_will(data: bytes) -> P.Will:
    from ..protocol.codec import Decoder
    pkts, err = Decoder(P.MQTT_5).feed(bytes(data))
    if err or not pkts:
        raise ValueError(f"unreadable will: {err}")
    return pkts[0].will
