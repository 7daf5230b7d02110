"""The dashboard's history worker process as the broker drives it (history.HistoryClient), with a
stand-in worker instead of Spark: one process for many questions, ended when idle, ended (and
replaced) when a question takes too long; errors and a vanished job come back as what they are."""
from __future__ import annotations

import asyncio
import socket
import sys

import pytest

from broker.dashboard.history import HistoryClient, JobNotRunning, make_query

pytestmark = pytest.mark.timeout(60)

FAKE = r"""
import json, sys, time
for line in sys.stdin:
    q = json.loads(line)
    f = q["filter"]
    if f == "slow/#":
        time.sleep(30)
    if f == "gone/#":
        print(json.dumps({"error": "not_running"}), flush=True)
    elif f == "bad/#":
        print(json.dumps({"error": "the history job could not answer: boom"}), flush=True)
    else:
        print(json.dumps({"answer": {"filter": f, "total": 1, "seconds": 0.0}}), flush=True)
"""


@pytest.fixture
def job_port():
    with socket.socket() as s:   # something listens where the job would (job_up)
        s.bind(("127.0.0.1", 0))
        s.listen(50)
        yield s.getsockname()[1]


def client(port: int, timeout: float = 5, idle: float = 60) -> HistoryClient:
    h = HistoryClient(f"sc://127.0.0.1:{port}", timeout, "python -m sink.job", idle)
    h.command = [sys.executable, "-c", FAKE]
    return h


def q(filt: str):
    return make_query(filt, None, None, 31)


async def test_one_worker_answers_every_question_and_ends_when_idle(job_port):
    h = client(job_port, idle=0.5)
    for _ in range(3):
        assert (await h.ask(q("a/#")))["filter"] == "a/#"
    assert h.started == 1
    proc = h.proc
    await asyncio.wait_for(proc.wait(), 10)   # idle: gone
    assert h.proc is None
    assert (await h.ask(q("a/#")))["total"] == 1 and h.started == 2   # the next one starts again
    await h.close()


async def test_a_question_past_the_timeout_ends_the_worker(job_port):
    h = client(job_port, timeout=1)
    await h.ask(q("a/#"))
    first = h.proc
    with pytest.raises(TimeoutError, match="history_timeout_seconds"):
        await h.ask(q("slow/#"))
    assert first.returncode is not None   # ended, with whatever it was doing
    assert (await h.ask(q("a/#")))["total"] == 1 and h.started == 2
    await h.close()


async def test_worker_errors_and_a_vanished_job(job_port):
    h = client(job_port)
    with pytest.raises(JobNotRunning):
        await h.ask(q("gone/#"))
    with pytest.raises(RuntimeError, match="boom"):
        await h.ask(q("bad/#"))
    await h.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # nothing listens: not started at all
    h = client(port)
    with pytest.raises(JobNotRunning, match="not running"):
        await h.ask(q("a/#"))
    assert h.started == 0


async def test_at_most_one_question_waits(job_port):
    h = client(job_port, timeout=3)
    slow = [asyncio.ensure_future(h.ask(q("slow/#"))) for _ in range(2)]
    await asyncio.sleep(0.5)
    from broker.dashboard.history import BadRequest
    with pytest.raises(BadRequest, match="busy"):
        await h.ask(q("a/#"))
    for f in slow:
        with pytest.raises(TimeoutError):
            await f
    await h.close()
