"""State that survives restarts, in SQLite (standard library, one file, WAL journal).

What is stored: persistent sessions (Session Expiry Interval > 0, or 3.1.1 clean
session 0) with their subscriptions, queued and in-flight outbound QoS messages
(packet identifiers and PUBREL state), inbound QoS 2 packet identifiers awaiting
PUBREL, the will; and every retained message. Clean sessions live in memory only.

Writes are batched: the core appends operations as it changes state and the server
commits them in one transaction per event-loop turn, before the turn's packets
(PUBACK, PUBREC, ...) are written. With `synchronous = NORMAL` a commit reaches the
OS before any acknowledgement, so a SIGKILL loses nothing acknowledged; `FULL` also
fsyncs for power loss, at a cost.

A damaged or truncated file never stops the broker: it is moved aside, every row
that can still be read is recovered into a fresh file, and the log says what was dropped.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import time

from ..protocol import packets as P
from ..protocol.properties import decode_properties, encode_properties
from ..core.message import Message
from ..core.session import NEVER, Session, Subscription

log = logging.getLogger("broker.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, topic TEXT NOT NULL, payload BLOB,
    qos INTEGER, retain INTEGER, props BLOB, expires_at REAL, accepted_at REAL);
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

_INS_MSG = "INSERT INTO messages VALUES (?,?,?,?,?,?,?,?)"
_INS_OUT = "INSERT INTO outbound VALUES (?,?,?,?,?,?,?,0)"
_DEL_OUT = "DELETE FROM outbound WHERE seq=?"
RETRY_FIRST, RETRY_MAX = 0.25, 5.0  # seconds between commit retries while the disk fails


def _ids(sub_ids) -> str | None:
    return ",".join(map(str, sub_ids)) if sub_ids else None


class Store:
    def __init__(self, path: str, clock=time.monotonic, wall=time.time, synchronous: str = "NORMAL"):
        self.path = path
        self.clock = clock
        self.wall = wall
        self.synchronous = synchronous
        self.ops: list = []
        self.failing = 0      # consecutive failed commits (0: healthy)
        self.retry_at = 0.0   # clock() before which a failing store does not try again
        self.db = self._open()
        self.seq = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM outbound").fetchone()[0]
        self.msg_seq = self.db.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0]
        self.dropped: dict[str, int] = {}

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
            return db

    def _rows(self, db, sql: str, what: str):
        """Rows of a query, stopping (and saying so) where the file is unreadable."""
        n = 0
        try:
            for row in db.execute(sql):
                n += 1
                yield row
        except sqlite3.DatabaseError as exc:
            log.error("state store: stopped reading %s after %d rows: %s (the rest is dropped)",
                      what, n, exc)
            self.dropped[what] = self.dropped.get(what, 0) + 1

    # ------------------------------------------------------------ restore
    def load(self, broker) -> dict:
        """Rebuild sessions, subscriptions, queues, in-flight state and retained messages."""
        t0 = time.perf_counter()
        src = self.db
        if self.salvaged:
            try:
                src = sqlite3.connect(self.salvaged)
            except sqlite3.DatabaseError as exc:
                log.error("state store: nothing recoverable in %s: %s", self.salvaged, exc)
                return {}
        now, wall = self.clock(), self.wall()
        messages: dict[int, Message] = {}

        def message(mid):
            return messages.get(mid)

        for row in self._rows(src, "SELECT * FROM messages", "messages"):
            try:
                mid, topic, payload, qos, retain, props, expires_at, accepted = row
                pr = decode_properties(props, 0, "PUBLISH")[0] if props else None
                exp = None if expires_at is None else now + (expires_at - wall)
                m = Message(topic, bytes(payload or b""), qos, bool(retain), pr, exp, None, accepted)
                m.store_id = mid
                messages[mid] = m
            except Exception as exc:
                self._drop("messages", exc)
        sessions = broker.sessions
        for row in self._rows(src, "SELECT * FROM sessions", "sessions"):
            try:
                cid, interval, expires_at, username, will, next_pid = row
                if expires_at is not None and expires_at <= wall:
                    continue  # expired while the broker was down
                s = Session(cid, broker.cfg.max_queued_messages, broker.cfg.queue_qos0_messages,
                            broker.stats, broker.sent_by_qos)
                s.expiry_interval = interval
                s.username = username
                s.next_pid = next_pid or 1
                # the broker stopped while the session was connected: it is offline from now
                s.expires_at = (now + (expires_at - wall) if expires_at is not None else
                                (None if interval == NEVER else now + interval))
                if will:
                    s.will = decode_will(will)
                s.store = self
                sessions[cid] = s
            except Exception as exc:
                self._drop("sessions", exc)
        for row in self._rows(src, "SELECT * FROM subscriptions", "subscriptions"):
            try:
                cid, filt, qos, no_local, rap, rh, sub_id = row
                s = sessions.get(cid)
                if s is None:
                    continue
                from ..core.topics import parse_shared
                shared = parse_shared(filt)
                group, tf = shared if shared else (None, filt)
                sub = Subscription(filt, tf, group, qos, bool(no_local), bool(rap), rh, sub_id, s)
                s.subscriptions[filt] = sub
                broker.router.add(sub)
            except Exception as exc:
                self._drop("subscriptions", exc)
        for row in self._rows(src, "SELECT * FROM outbound ORDER BY seq", "outbound"):
            try:
                seq, cid, mid, qos, retain, ids, pid, released = row
                s = sessions.get(cid)
                m = message(mid)
                if s is None or m is None:
                    continue
                sub_ids = tuple(int(x) for x in ids.split(",")) if ids else None
                if pid:
                    s.inflight_out[pid] = [m, qos, bool(retain), sub_ids, bool(released), seq]
                else:
                    s.queue.append((m, qos, bool(retain), sub_ids, seq))
            except Exception as exc:
                self._drop("outbound", exc)
        for row in self._rows(src, "SELECT * FROM qos2_in", "qos2_in"):
            s = sessions.get(row[0])
            if s is not None:
                s.inflight_in.add(row[1])
        nret = 0
        for row in self._rows(src, "SELECT * FROM retained", "retained"):
            m = message(row[1])
            if m is not None and (m.expires_at is None or m.expires_at > now):
                broker.retained.set(row[0], m)
                nret += 1
        # wills of sessions that were connected when the broker stopped: an abnormal end
        for s in sessions.values():
            if s.will is not None:
                from ..protocol import properties as PR
                delay = (s.will.properties or {}).get(PR.WILL_DELAY_INTERVAL, 0)
                s.will_at = now + delay
                broker.delayed_wills[s.client_id] = s
        if self.salvaged:
            src.close()
            self.snapshot(broker)
        summary = {"sessions": len(sessions), "retained": nret, "messages": len(messages),
                   "seconds": round(time.perf_counter() - t0, 3), "dropped": dict(self.dropped)}
        log.info("restored %d sessions, %d retained messages, %d stored messages in %.3fs%s",
                 len(sessions), nret, len(messages), summary["seconds"],
                 f"; dropped unreadable: {self.dropped}" if self.dropped else "")
        return summary

    def _drop(self, what: str, exc: Exception) -> None:
        self.dropped[what] = self.dropped.get(what, 0) + 1
        log.warning("state store: dropped an unreadable %s row: %s", what, exc)

    def snapshot(self, broker) -> None:
        """Write the whole in-memory state (after recovering from a damaged file)."""
        self.ops.clear()
        for s in broker.sessions.values():
            if s.store is None:
                continue
            self.save_session(s)
            for sub in s.subscriptions.values():
                self.save_subscription(s.client_id, sub)
            for i, (m, qos, retain, ids, seq) in enumerate(list(s.queue)):
                s.queue[i] = (m, qos, retain, ids, self.enqueue(s.client_id, m, qos, retain, ids))
            for pid, e in s.inflight_out.items():
                e[5] = self.enqueue(s.client_id, e[0], e[1], e[2], e[3], pid)
                if e[4]:
                    self.set_released(e[5])
            for pid in s.inflight_in:
                self.qos2_add(s.client_id, pid)
        for m in broker.retained.all():
            self.retain_set(m.topic, m)
        self.commit()

    # ------------------------------------------------------------ changes (batched)
    def _message_id(self, msg: Message) -> int:
        mid = msg.store_id
        if mid is None:
            self.msg_seq += 1
            mid = msg.store_id = self.msg_seq
            exp = None if msg.expires_at is None else self.wall() + (msg.expires_at - self.clock())
            self.ops.append((_INS_MSG, (mid, msg.topic, msg.payload, msg.qos, int(msg.retain),
                                        encode_properties(msg.props) if msg.props else None,
                                        exp, msg.accepted_at)))
        return mid

    def enqueue(self, client_id: str, msg: Message, qos: int, retain: bool, sub_ids,
                pid: int | None = None) -> int:
        mid = self._message_id(msg)
        self.seq += 1
        self.ops.append((_INS_OUT, (self.seq, client_id, mid, qos, int(retain), _ids(sub_ids), pid)))
        return self.seq

    def set_pid(self, seq: int, pid: int) -> None:
        self.ops.append(("UPDATE outbound SET pid=? WHERE seq=?", (pid, seq)))

    def set_released(self, seq: int) -> None:
        self.ops.append(("UPDATE outbound SET released=1 WHERE seq=?", (seq,)))

    def remove(self, seq: int) -> None:
        self.ops.append((_DEL_OUT, (seq,)))

    def qos2_add(self, client_id: str, pid: int) -> None:
        self.ops.append(("INSERT OR REPLACE INTO qos2_in VALUES (?,?)", (client_id, pid)))

    def qos2_remove(self, client_id: str, pid: int) -> None:
        self.ops.append(("DELETE FROM qos2_in WHERE client_id=? AND pid=?", (client_id, pid)))

    def save_session(self, s: Session) -> None:
        exp = None if s.expires_at is None else self.wall() + (s.expires_at - self.clock())
        self.ops.append(("INSERT OR REPLACE INTO sessions VALUES (?,?,?,?,?,?)",
                         (s.client_id, s.expiry_interval, exp, s.username,
                          encode_will(s.will) if s.will else None, s.next_pid)))

    def delete_session(self, client_id: str) -> None:
        for sql in ("DELETE FROM sessions WHERE client_id=?", "DELETE FROM subscriptions WHERE client_id=?",
                    "DELETE FROM outbound WHERE client_id=?", "DELETE FROM qos2_in WHERE client_id=?"):
            self.ops.append((sql, (client_id,)))

    def save_subscription(self, client_id: str, sub: Subscription) -> None:
        self.ops.append(("INSERT OR REPLACE INTO subscriptions VALUES (?,?,?,?,?,?,?)",
                         (client_id, sub.filter, sub.qos, int(sub.no_local),
                          int(sub.retain_as_published), sub.retain_handling, sub.sub_id)))

    def delete_subscription(self, client_id: str, filt: str) -> None:
        self.ops.append(("DELETE FROM subscriptions WHERE client_id=? AND filter=?", (client_id, filt)))

    def retain_set(self, topic: str, msg: Message | None) -> None:
        if msg is None:
            self.ops.append(("DELETE FROM retained WHERE topic=?", (topic,)))
        else:
            self.ops.append(("INSERT OR REPLACE INTO retained VALUES (?,?)", (topic, self._message_id(msg))))

    def commit(self) -> int:
        """Apply the pending operations in one transaction; returns how many, or -1 when they
        could not be written (disk full, I/O error): then they stay pending and are retried,
        with a growing delay, by the next commit; the caller fails what depended on them."""
        ops = self.ops
        if not ops:
            return 0
        if self.failing and self.clock() < self.retry_at:
            return -1
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
        self.ops = []
        if self.failing:
            log.info("state store: writes to %s succeed again (%d changes kept in memory were "
                     "written)", self.path, n)
            self.failing = 0
        return n

    def _commit_failed(self, exc: sqlite3.Error, ops: list) -> None:
        try:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        if not isinstance(exc, sqlite3.OperationalError):  # a bad statement: retrying won't help
            log.error("state store: dropped %d changes that cannot be written: %s", len(ops), exc)
            self.ops = []
            return
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

    def collect_garbage(self) -> None:
        """Delete stored messages nothing refers to any more."""
        if self.commit() < 0:
            return
        try:
            self.db.execute("DELETE FROM messages WHERE id NOT IN (SELECT msg_id FROM outbound) "
                            "AND id NOT IN (SELECT msg_id FROM retained)")
        except sqlite3.OperationalError as exc:
            log.warning("state store: garbage collection failed (retried later): %s", exc)

    def close(self) -> None:
        self.failing = 0  # a last try
        self.commit()
        if self.ops:
            log.error("state store: %d changes could not be written to %s at shutdown",
                      len(self.ops), self.path)
        self.collect_garbage()
        self.db.close()


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
