"""The replay's worker processes as a client can make the broker start them (sink/replay/hook.py
Workers, WorkerControl), with the real process handling and a stand-in worker program (a shell
script reading its stdin, in place of `python -m sink.replay.worker`): one process per
subscription however often one SUBSCRIBE repeats its filter [MQTT-3.8.4-3], never more processes
than `[replay] max_replays` (those killed but not reaped yet included), and the event loop never
waits for a process to start."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from broker.protocol import packets as P
from settings.tree import ReplayConfig
from tests.sansio import Client, make
from tests.sansio_pubsub import take
from tests.unit.test_replay import NOW_MS, AvailableHook, SinkIds

O = P.SubscriptionOptions
pytestmark = pytest.mark.timeout(60)  # (a worker left running must not hang the run)


class Spawns:
    """subprocess.Popen, counted (what asyncio's subprocesses use too): each process started,
    and how many started before it were not reaped yet when it started."""

    def __init__(self, monkeypatch, tmp_path, delay: float = 0.0):
        script = tmp_path / "fake-python"
        script.write_text("#!/bin/sh\nexec sleep 600\n")  # says nothing, waits to be killed
        script.chmod(0o755)
        monkeypatch.setattr(sys, "executable", str(script))
        self.procs: list = []
        self.unreaped_at_start: list[int] = []
        real, spawns = subprocess.Popen, self

        class Counted(real):  # type: ignore[misc, valid-type]
            def __init__(self, *a, **kw):
                if delay:
                    time.sleep(delay)  # a slow fork (a large broker process, a busy machine)
                spawns.unreaped_at_start.append(
                    sum(1 for p in spawns.procs if p.returncode is None))
                super().__init__(*a, **kw)
                spawns.procs.append(self)

        monkeypatch.setattr(subprocess, "Popen", Counted)

    def run(self, main) -> None:
        """asyncio.run(main()); whatever happens, no stand-in process is left running."""
        async def guarded():
            try:
                await main()
            finally:
                for p in self.procs:
                    if p.returncode is None:
                        try:
                            p.kill()
                        except ProcessLookupError:
                            pass
        asyncio.run(guarded())


def setup(**cfg):
    b, clock = make()
    clock.t = NOW_MS / 1000
    ids = SinkIds()
    b.add_hook(ids)
    hook = AvailableHook(ReplayConfig(**cfg), ids, {"table": "unused"})  # the real WorkerControl
    b.add_hook(hook)
    return b, hook


async def settle(hook, seconds: float = 0.5, until=None) -> None:
    """Event-loop turns until the workers asked for have started and the ended ones are reaped:
    ``seconds``, or with ``until`` as soon as it holds (at most 15 s: processes start and are
    reaped in a thread, slower on a loaded machine)."""
    end = time.monotonic() + (15.0 if until is not None else seconds)
    while time.monotonic() < end and not (until is not None and until()):
        await asyncio.sleep(0.02)


async def stop_all(hook) -> None:
    hook.on_stop()
    end = time.monotonic() + 5
    while getattr(hook, "workers", None) and hook.workers.alive and time.monotonic() < end:
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("repeats", [20, 200])
def test_a_filter_repeated_in_one_subscribe_starts_one_worker(monkeypatch, tmp_path, repeats):
    """[MQTT-3.8.4-3]: a filter repeated in one SUBSCRIBE is one subscription, the last one
    replacing the others: one worker process, not one per repeat."""
    spawns = Spawns(monkeypatch, tmp_path)

    async def main():
        b, hook = setup()
        c = Client(b, P.MQTT_5)
        c.connect("bob")
        c.send(P.Subscribe(1, [("$replay/-1m/bob/t0", O(1))] * repeats))
        ack = take(c, P.SUBACK)
        assert ack.reason_codes == [1] * repeats
        await settle(hook, until=lambda: len(spawns.procs) >= 1)
        await settle(hook)   # time for any other process to start
        assert len(spawns.procs) == 1
        assert len(hook.feeds) == 1
        await stop_all(hook)
        assert all(p.returncode is not None for p in spawns.procs)  # reaped: no zombie left

    spawns.run(main)


def test_worker_processes_never_exceed_max_replays_even_while_being_reaped(monkeypatch, tmp_path):
    """A client that subscribes again and again (each SUBSCRIBE replacing its replay) and
    clients that come and go: never more processes at once than [replay] max_replays, counting
    those killed and not reaped yet."""
    spawns = Spawns(monkeypatch, tmp_path)

    async def main():
        b, hook = setup(max_replays=2, max_per_client=2, max_per_user=2)
        c = Client(b, P.MQTT_5)
        c.connect("bob")
        for i in range(15):
            c.send(P.Subscribe(i + 1, [("$replay/-1m/bob/t0", O(1)), ("$replay/-1m/bob/t1", O(1))]))
            assert take(c, P.SUBACK).reason_codes == [1, 1]
            await asyncio.sleep(0.005)
        await settle(hook, until=lambda: hook.workers.alive == 2 and len(hook.feeds) == 2)
        assert spawns.procs and max(spawns.unreaped_at_start) < 2
        assert hook.workers.alive == 2 and len(hook.feeds) == 2
        await stop_all(hook)
        assert hook.workers.alive == 0

    spawns.run(main)


def test_starting_a_worker_never_holds_the_event_loop(monkeypatch, tmp_path):
    """Fork and exec run in a thread: with a process start that takes 0.4 s, the event loop
    goes on turning (another client's PINGREQ would be answered) meanwhile."""
    spawns = Spawns(monkeypatch, tmp_path, delay=0.4)

    async def main():
        b, hook = setup()
        c = Client(b, P.MQTT_5)
        c.connect("bob")
        c.send(P.Subscribe(1, [("$replay/-1m/bob/t0", O(1)), ("$replay/-1m/bob/t1", O(1))]))
        take(c, P.SUBACK)
        gaps, last = [], time.monotonic()
        end = last + 1.2
        while time.monotonic() < end:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        assert len(spawns.procs) == 2
        assert max(gaps) < 0.2   # a start on the loop held it 0.4 s
        await stop_all(hook)

    spawns.run(main)
