"""The replay hook: SUBSCRIBE "$replay/<from>[..<to>]/<filter>" (docs/history.md "Replay over MQTT").

The core hands such a filter to ``ReplayHook.replay`` (broker/core/hooks.py REPLAY). It checks
the filter (spec.py), the ACL on the filter replayed, the limits, and that a history can be read
(the history table exists; pyarrow and numpy can be imported), then installs the subscription:
the one the client sees, under its "$replay/..." filter, in ``session.subscriptions`` (it is
not stored with a persistent session: a replay belongs to its connection and ends with it), and
a HistoryFeed (feed.py) that taps the live messages and feeds the session. The history itself
is read by a child process (worker.py) that a WorkerControl starts and reads, frame by frame,
only when the feed asks.

What a client can make the broker hold, and its bounds: a replay reading history holds a worker
process; there are at most ``max_replays`` of them in the broker (``Workers``: counted from the
start asked for until the process is reaped, so a client that subscribes and unsubscribes in a
loop cannot pile processes up), ``max_per_client`` per client and ``max_per_user`` per user (all
anonymous clients together count as one user). A worker starts after the event-loop turn that
asked for it (a SUBSCRIBE that repeats a filter replaces the earlier ones before any starts:
[MQTT-3.8.4-3]) and is started and reaped by a thread, never by the event loop. A replay that
has caught up (live) holds no worker and no slot. A replay whose client takes none of the
messages waiting for it for ``idle_seconds`` ends (the client is disconnected, saying why).
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any, Callable

from broker.core.hooks import Hook
from broker.core.session import Subscription
from broker.protocol import reason_codes as rc

from .feed import LIVE, HistoryFeed, Limits
from .records import FRAME_HEAD, iso_ms
from .spec import BadReplay, parse

if TYPE_CHECKING:
    from broker.core.connection import Connection
    from broker.core.hookhost import HookHost
    from broker.core.session import Session
    from broker.protocol.packets import SubscriptionOptions
    from settings import Config
    from settings.tree import ReplayConfig

    from ..forward.service import Sink

log = logging.getLogger(__name__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ReplayHook(Hook):
    """``sink``: anything with accepted_seq() and forwarded_seq() (sink.forward.service.Sink);
    ``worker``: the settings every worker gets (table, committed_file, data_dir, bootstrap,
    kafka, topics, verify, nice, max_bytes, table_buffer_bytes); ``cfg``: settings.ReplayConfig."""
    provides = frozenset({"replay", "on_client_disconnected", "on_tick", "on_stop", "stats"})

    def __init__(self, cfg: ReplayConfig, sink: Any, worker: dict,
                 control_factory: Callable[[ReplayHook, dict], WorkerControl] | None = None) -> None:
        self.cfg = cfg
        self.sink = sink
        self.worker = worker
        self.limits = Limits(cfg.live_buffer_messages, cfg.live_buffer_bytes)
        self.control_factory = control_factory or WorkerControl
        self.workers = Workers(cfg.max_replays, nice=cfg.nice)
        # imported now, at the broker's start, rather than by the first replay's SUBSCRIBE (70 ms
        # or more of the event loop: another client's PINGREQ waited that long)
        import sink.history.manifest  # noqa: F401
        self.broker: HookHost = None  # type: ignore[assignment]  # the core's Broker, set by attach()
        self._available: tuple[float, str | None] | None = None  # (checked at, unavailable())
        self.feeds: dict = {}                 # HistoryFeed -> None, while they run
        self.by_session: dict = {}            # Session -> [HistoryFeed]
        self.totals = {"started": 0, "failed": 0, "refused": 0, "messages_table": 0,
                       "messages_kafka": 0, "messages_live_held": 0}

    @classmethod
    def from_config(cls, cfg: Config, sink: Sink) -> "ReplayHook":
        """From the whole configuration (settings.Config) and the started sink."""
        from ..forward.service import committed_file
        h, s = cfg.history, cfg.sink
        topics = list(h.kafka_topics) or list(dict.fromkeys([s.topic, *(r.topic for r in s.rules)]))
        worker = dict(table=h.table, committed_file=committed_file(s, h), data_dir=cfg.data_dir,
                      bootstrap=sink.bootstrap, kafka=dict(s.kafka), topics=topics,
                      verify=h.verify_records, nice=cfg.replay.nice,
                      max_bytes=cfg.replay.kafka_buffer_bytes,
                      table_buffer_bytes=cfg.replay.table_buffer_bytes,
                      log_level=log.getEffectiveLevel())
        return cls(cfg.replay, sink, worker)

    def attach(self, broker: HookHost) -> None:
        self.broker = broker

    # ------------------------------------------------------------ SUBSCRIBE
    def unavailable(self) -> str | None:
        """Why no history can be read now, or None."""
        if not self.cfg.enabled:
            return "history replay is turned off on this broker ([replay] enabled = false)"
        from sink.history.manifest import Table
        if not Table(self.worker["table"]).exists():
            return (f"there is no history table at {self.worker['table']} yet: the history job "
                    "(python -m sink.job) makes it")
        missing = [m for m in ("pyarrow", "numpy") if importlib.util.find_spec(m) is None]
        if missing:
            return (f"history replay needs {' and '.join(missing)} in the broker's Python "
                    "environment (pip install -r requirements-broker.txt)")
        return None

    def _unavailable_now(self) -> str | None:
        """unavailable(), asked at most once a second (a SUBSCRIBE of many replay filters does
        not list the table's directory for each)."""
        now = self.broker.clock()
        cached = self._available
        if cached is None or not 0 <= now - cached[0] < 1.0:
            cached = self._available = (now, self.unavailable())
        return cached[1]

    def replay(self, conn: Connection, filt: str, o: SubscriptionOptions, sub_id: int | None) -> tuple[int, str | None]:
        """The SUBACK's code (and Reason String) for one "$replay/..." filter. Whatever goes
        wrong in here refuses that filter (0x80, one rate-limited log line), never the
        connection."""
        try:
            return self._replay(conn, filt, o, sub_id)
        except Exception as exc:
            conn.note(logging.WARNING, "%s: replay %s refused: %s: %s", conn.client_id, filt,
                      type(exc).__name__, exc)
            return self._refused(rc.UNSPECIFIED_ERROR, f"{filt}: the broker could not start "
                                 "this replay (its log says why)")

    def _replay(self, conn: Connection, filt: str, o: SubscriptionOptions,
                sub_id: int | None) -> tuple[int, str | None]:
        b = self.broker
        mq = b.cfg
        session = conn.session
        try:
            spec = parse(filt, int(b.wall() * 1000))
        except BadReplay as exc:
            return self._refused(rc.TOPIC_FILTER_INVALID, f"{filt}: {exc}")
        tf = spec.filter
        if tf.count("/") >= mq.max_topic_levels or len(filt) > mq.max_topic_length:
            return self._refused(rc.TOPIC_FILTER_INVALID, f"{filt}: too long or too many levels")
        if not mq.wildcard_subscription_available and ("+" in tf or "#" in tf):
            return self._refused(rc.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, None)
        if sub_id is not None and not mq.subscription_identifiers_available:
            return self._refused(rc.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED, None)
        if not b.auth.allow_subscribe(conn.client_id, conn.username, tf):
            return self._refused(rc.NOT_AUTHORIZED, f"{filt}: not authorized to read {tf}")
        problem = self._unavailable_now()
        if problem:
            return self._refused(rc.IMPLEMENTATION_SPECIFIC_ERROR, f"{filt}: {problem}")
        mine = self.by_session.get(session, [])
        replaced = [f for f in mine if f.filter == filt]  # [MQTT-3.8.4-3]: the new one replaces it
        if (filt not in session.subscriptions and mq.max_subscriptions_per_client
                and len(session.subscriptions) >= mq.max_subscriptions_per_client):
            return self._refused(rc.QUOTA_EXCEEDED, None)
        # the slots: replays reading history (a worker each); one replaced frees its own
        reading = [f for f in self.feeds if f.state is not LIVE and f not in replaced]
        if len(reading) >= self.cfg.max_replays:
            return self._refused(rc.QUOTA_EXCEEDED, f"{filt}: {len(reading)} replays run "
                                 f"already, the most at once ([replay] max_replays); try later")
        if len(mine) - len(replaced) >= self.cfg.max_per_client:
            return self._refused(rc.QUOTA_EXCEEDED, f"{filt}: this client runs "
                                 f"{self.cfg.max_per_client} replays already ([replay] "
                                 "max_per_client)")
        user = session.username
        if sum(1 for f in reading if f.session.username == user) >= self.cfg.max_per_user:
            return self._refused(rc.QUOTA_EXCEEDED, f"{filt}: {'user ' + repr(user) if user else 'anonymous clients'} "
                                 f"run {self.cfg.max_per_user} replays already ([replay] "
                                 "max_per_user); try later")
        for old in replaced:
            old.end("replaced by a new SUBSCRIBE")
        qos = min(o.qos, mq.maximum_qos)
        v5 = conn.level == 5
        no_local, rap = bool(o.no_local and v5), bool(o.retain_as_published and v5)
        # the subscription the client sees (and UNSUBSCRIBEs): never in the router (its topic
        # filter is the $replay/ one, which no topic matches); the feed's tap is
        book = Subscription(filt, filt, None, qos, no_local, rap, 0, sub_id, session)
        old = session.subscriptions.get(filt)
        if old is not None:
            b.remove_subscription(old)
        session.add_subscription(book)
        feed = None
        try:
            control = self.control_factory(self, dict(self.worker, filter=tf,
                                                      since_ms=spec.since_ms,
                                                      until_ms=spec.until_ms))
            feed = HistoryFeed(b, session, book, spec, qos, no_local, rap, sub_id, control,
                               self.limits, on_end=self._ended)
            control.feed = feed
            self.feeds[feed] = None
            self.by_session.setdefault(session, []).append(feed)
            session.add_feed(feed)
            feed.start()
        except Exception:  # nothing of it is left: refused (replay())
            if feed is not None:
                feed.end("it could not start")
            if session.subscriptions.get(filt) is book:
                del session.subscriptions[filt]
            raise
        self.totals["started"] += 1
        conn.note(logging.INFO, "%s: replaying %s from %s%s", conn.client_id, tf,
                  iso_ms(spec.since_ms), f" to {iso_ms(spec.until_ms)}"
                  if spec.until_ms is not None else ", then live")
        return qos, None

    def _refused(self, code: int, why: str | None) -> tuple[int, str | None]:
        self.totals["refused"] += 1
        return code, why

    def _ended(self, feed: HistoryFeed) -> None:
        self.feeds.pop(feed, None)
        mine = self.by_session.get(feed.session)
        if mine is not None and feed in mine:
            mine.remove(feed)
            if not mine:
                del self.by_session[feed.session]
        c = feed.counts
        self.totals["messages_table"] += c["table"]
        self.totals["messages_kafka"] += c["kafka"]
        self.totals["messages_live_held"] += c["live"]
        if feed.why.startswith("failed"):
            self.totals["failed"] += 1

    # ------------------------------------------------------------ lifecycle
    def on_client_disconnected(self, session: Session, publish_will: bool) -> None:
        """A replay belongs to its connection: it ends, and its subscription goes (it is not
        there when a persistent session resumes: subscribe again from the last time seen)."""
        mine = self.by_session.get(session)
        if not mine:
            return
        for feed in list(mine):
            if session.subscriptions.get(feed.filter) is feed.book:
                session.drop_subscription(feed.filter)
            feed.end("the client disconnected")

    def on_tick(self) -> None:
        if not self.feeds:
            return
        forwarded = self.sink.forwarded_seq()
        wall, now = self.broker.wall(), self.broker.clock()
        idle = self.cfg.idle_seconds
        for feed in list(self.feeds):
            if feed.session.subscriptions.get(feed.filter) is not feed.book:
                feed.end("unsubscribed")
            elif feed.live_until_passed(wall):
                feed.end("its time range ended")
            elif idle and feed.idle_for(now) >= idle:
                feed.fail(f"the client took none of the replayed messages waiting for it for "
                          f"{idle:g} s ([replay] idle_seconds)")
            else:
                feed.poll_sync(forwarded)

    def on_stop(self) -> None:
        for feed in list(self.feeds):
            feed.end("the broker stops")

    def stats(self) -> dict:
        return {"replay": {"active": len(self.feeds), **self.totals}}


def spawn_worker(nice: int = 10) -> subprocess.Popen:
    """A worker process (python -m sink.replay.worker), its settings still to come on stdin, at
    niceness ``nice`` from its first instruction (its start - Python, numpy - is CPU the live
    traffic should have first). Called in a thread of Workers: never on the event loop."""
    env = {**os.environ, "PYTHONPATH": ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                               if os.environ.get("PYTHONPATH") else "")}
    proc = subprocess.Popen([sys.executable, "-m", "sink.replay.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, cwd=ROOT, bufsize=0)
    try:
        os.setpriority(os.PRIO_PROCESS, proc.pid, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))
    except OSError:
        pass
    return proc


def end_worker(proc: subprocess.Popen) -> None:
    """Killed (it holds nothing worth a goodbye) and reaped; in a thread of Workers."""
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    proc.wait()


class Workers:
    """The broker's replay worker processes, at most ``limit`` at once: a process counts from
    the start asked for until it is reaped. A start asked for waits for the end of the event-loop
    turn (a control closed meanwhile - a filter repeated in one SUBSCRIBE replaced it - never
    starts one) and for a free slot. Processes are started and reaped by a thread of their own
    (``spawn``, ``end``: fork, exec and wait never run on the event loop)."""

    def __init__(self, limit: int, spawn: Callable[..., Any] = spawn_worker,
                 end: Callable[[Any], None] = end_worker, nice: int = 10) -> None:
        self.limit = limit
        self.spawn = spawn
        self.nice = nice
        self.end = end
        self.alive = 0                        # processes asked for, started or being reaped
        self.started = 0                      # processes started, in all
        self.waiting: deque[WorkerControl] = deque()
        self.scheduled = False
        self.pool: ThreadPoolExecutor | None = None

    def request(self, control: WorkerControl) -> None:
        self.waiting.append(control)
        self._schedule()

    def forget(self, control: WorkerControl) -> None:
        """A control closed before its process started: it waits no more."""
        try:
            self.waiting.remove(control)
        except ValueError:
            pass

    def _schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._start_waiting)

    def _start_waiting(self) -> None:
        self.scheduled = False
        loop = asyncio.get_running_loop()
        while self.waiting and self.alive < self.limit:
            control = self.waiting.popleft()
            if control.closed:
                continue
            self.alive += 1
            control.task = loop.create_task(self._life(control))

    async def _life(self, control: WorkerControl) -> None:
        try:
            await control.run(self)
        finally:
            self.alive -= 1
            if self.waiting:
                self._schedule()

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="replay-workers")
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)


class WorkerControl:
    """The broker's side of one worker process (worker.py): asked for (hook.workers) at the
    first want(); one frame read per want(); sync requests and the end on its stdin."""

    def __init__(self, hook: ReplayHook, settings: dict):
        self.hook = hook
        self.settings = settings
        self.feed: HistoryFeed | None = None
        self.proc: Any = None                 # the subprocess.Popen, once started
        self.stdin: asyncio.WriteTransport | None = None
        self.task: asyncio.Task | None = None
        self.requested = False
        self.wanted = asyncio.Event()
        self.lines: list = []                 # written once the process runs
        self.closed = False

    def arm(self) -> int:
        return self.hook.sink.accepted_seq()

    def want(self) -> None:
        if self.closed:
            return
        self.wanted.set()
        if not self.requested:
            self.requested = True
            self.hook.workers.request(self)

    def sync(self, generation: int) -> None:
        self._line({"sync": generation})

    def _line(self, obj: dict) -> None:
        data = json.dumps(obj).encode() + b"\n"
        if self.stdin is None:
            self.lines.append(data)
        elif not self.closed and not self.stdin.is_closing():
            self.stdin.write(data)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.wanted.set()
        self.hook.workers.forget(self)
        proc = self.proc
        if proc is not None and proc.returncode is None:
            try:
                proc.kill()  # (a signal: the task reaps it, in a thread)
            except ProcessLookupError:
                pass

    async def run(self, workers: Workers) -> None:
        try:
            proc = self.proc = await workers.in_thread(workers.spawn, workers.nice)
        except OSError as exc:
            return self._failed(f"cannot start the replay worker: {exc}")
        workers.started += 1
        loop = asyncio.get_running_loop()
        transports: list = []
        try:
            if self.closed:
                return
            reader = asyncio.StreamReader()
            rt, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                 proc.stdout)
            transports.append(rt)
            wt, _ = await loop.connect_write_pipe(asyncio.Protocol, proc.stdin)
            transports.append(wt)
            # the settings (Kafka credentials among them) on stdin, never on the command line
            wt.write(json.dumps(self.settings).encode() + b"\n")
            for line in self.lines:
                wt.write(line)
            self.lines.clear()
            self.stdin = wt
            import pickle
            while not self.closed:
                await self.wanted.wait()
                self.wanted.clear()
                if self.closed:
                    break
                head = await reader.readexactly(FRAME_HEAD.size)
                body = await reader.readexactly(FRAME_HEAD.unpack(head)[0])
                if self.closed:
                    break
                # (the feed is set before the first want())
                self.feed.add(pickle.loads(body))  # type: ignore[union-attr]
                self.feed.poll_sync(  # type: ignore[union-attr]
                    self.hook.sink.forwarded_seq())
        except asyncio.IncompleteReadError:
            if not self.closed:
                self._failed("the replay worker stopped (the broker's log says why)")
        except Exception as exc:  # never let a replay take the event loop down
            log.exception("replay: reading the worker failed")
            self._failed(f"reading the replay worker failed: {exc}")
        finally:
            self.stdin = None
            for t in transports:
                t.close()
            await workers.in_thread(workers.end, proc)
            for f in (proc.stdin, proc.stdout):
                _close(f)

    def _failed(self, why: str) -> None:
        if self.feed is not None and not self.closed:
            self.feed.fail(why)


def _close(f: IO[bytes] | None) -> None:
    if f is not None:
        try:
            f.close()
        except OSError:
            pass
