"""Nothing acknowledged is lost when the disk fails: the sink's barrier fails for records the
spool could not write, and the spool writes again once the disk recovers."""
import asyncio
import errno
import logging
import os
import time
import types

import pytest

from kafka_client.record import SinkRecord, encode_entry
from sink.forward.service import Sink
from sink.forward.spool import SpoolWriter
from tests.diskfull import SmallFS
from tests.unit.test_spool import ids, read_all

ENOSPC = OSError(errno.ENOSPC, "No space left on device")
BIG = 9000  # bytes per record: more than the page a full tmpfs may still have room in


def payload(i: int) -> bytes:
    return encode_entry("mqtt.messages", b"t", i.to_bytes(4, "big") + bytes(BIG), [], 1000 + i)


def fake_sink(tmp_path) -> Sink:
    """A Sink whose spool writer is driven by hand: seqs appended, writes reported."""
    s = Sink({"durability": "spool"}, str(tmp_path))
    s._writer = types.SimpleNamespace(next_seq=0, kick=lambda: None)
    return s


def append(s: Sink, n: int = 1) -> None:
    s._writer.next_seq += n


async def settle():
    for _ in range(3):
        await asyncio.sleep(0)


async def test_barrier_fails_when_its_records_fail():
    s = fake_sink("/nonexistent")
    append(s, 2)
    fut = s.barrier()
    s._on_write_error(1, 2, ENOSPC)
    await settle()
    with pytest.raises(OSError, match="No space"):
        fut.result()
    append(s)                    # the disk recovered: the next records succeed
    fut = s.barrier()
    s._on_durable(2, 1)
    await settle()
    assert fut.done() and fut.exception() is None


async def test_barrier_covering_a_failed_batch_and_a_good_one_fails():
    """Records 0..3 wait on one barrier; 0..1 fail, 2..3 are written: still a failure."""
    s = fake_sink("/nonexistent")
    append(s, 4)
    fut = s.barrier()
    s._on_write_error(1, 2, ENOSPC)
    s._on_durable(3, 2)
    await settle()
    assert isinstance(fut.exception(), OSError)


async def test_records_handled_before_the_barrier():
    """The writer thread may fail (and then write later records) before the loop asks."""
    s = fake_sink("/nonexistent")
    s._loop = asyncio.get_running_loop()
    append(s, 2)
    s._on_write_error(0, 1, ENOSPC)
    s._on_durable(1, 1)
    fut = s.barrier()
    assert fut is not None and isinstance(fut.exception(), OSError)
    append(s)
    s._on_durable(2, 1)
    assert s.barrier() is None   # written, nothing of it failed
    await settle()


async def test_barrier_with_nothing_new_never_waits_forever():
    s = fake_sink("/nonexistent")
    append(s)
    s._on_write_error(0, 1, ENOSPC)  # a QoS 0 record failed, nobody waited for it
    await settle()
    fut = s.barrier()            # before the fix: a future nothing would ever resolve
    assert fut is None or isinstance(fut.exception(), OSError)


@pytest.fixture
def small_fs(tmp_path):
    fs = SmallFS(tmp_path / "fs", "1m")
    yield fs
    fs.close()


def test_spool_writer_refuses_on_disk_full_and_recovers(small_fs, caplog):
    d = os.path.join(small_fs.path, "spool")
    os.makedirs(d)
    errors, durable = [], []
    w = SpoolWriter(d, on_durable=lambda last, n: durable.append((last, n)),
                    on_error=lambda last, n, exc: errors.append((last, n, exc.errno))).open()
    try:
        for i in range(10):
            w.append(payload(i))
        assert w.flush(10)
        small_fs.fill()
        with caplog.at_level(logging.INFO, logger="sink.forward.spool"):
            for i in range(10, 20):
                w.append(payload(i))
            w.kick()
            deadline = time.monotonic() + 10
            while sum(e[1] for e in errors) < 10 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sum(e[1] for e in errors) == 10 and {e[2] for e in errors} == {errno.ENOSPC}
            assert w.durable_seq == 9
            w.append(payload(20))  # still full: refused too
            deadline = time.monotonic() + 10
            while sum(e[1] for e in errors) < 11 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sum(e[1] for e in errors) == 11
            small_fs.free()
            for i in range(21, 30):
                w.append(payload(i))
            assert w.flush(10)
        logs = [r for r in caplog.records if r.name == "sink.forward.spool"]
        assert len([r for r in logs if r.levelno == logging.ERROR]) == 1  # once per burst
        assert "free disk space" in logs[0].getMessage()
        assert any("succeed again" in r.getMessage() and r.levelno == logging.INFO for r in logs)
    finally:
        w.close()
    # the reader sees the records written before and after, none of the refused ones
    recs = read_all(d)
    assert ids(recs) == list(range(10)) + list(range(21, 30))
    # a restart continues after them
    w = SpoolWriter(d).open()
    assert w.next_seq == 30
    w.close()


@pytest.mark.timeout(60)
async def test_sink_barrier_fails_on_disk_full_then_recovers(small_fs, tmp_path):
    """The Sink with its real spool writer on a full disk (Kafka unreachable: not needed)."""
    from kafka_client.embedded import free_port
    s = Sink.from_config({"bootstrap_servers": f"127.0.0.1:{free_port()}", "forwarder": "thread",
                          "drain_timeout_seconds": 0.5,
                          "spool_dir": os.path.join(small_fs.path, "spool")}, str(tmp_path))
    s.start()

    def rec(i):
        return SinkRecord(topic="a/b", payload=bytes(BIG), qos=1, retain=False, client_id="c",
                          username=None, protocol=5, accepted_at_ms=int(time.time() * 1000))
    try:
        assert s.submit(rec(0))
        await asyncio.wait_for(s.barrier(), 10)
        small_fs.fill()
        assert s.submit(rec(1))
        with pytest.raises(OSError):
            await asyncio.wait_for(s.barrier(), 10)
        small_fs.free()
        assert s.submit(rec(2))
        await asyncio.wait_for(s.barrier(), 10)   # the spool writes again
        assert s.stats()["spool_errors"] == 1 and s.stats()["spooled"] == 2
    finally:
        s.close()
