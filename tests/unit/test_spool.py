"""The on-disk spool: append + group commit, torn/corrupt tails, checkpoint, replay, retention."""
import asyncio
import logging
import os
import time

import pytest

from kafka_client.record import SinkRecord, decode_entry, encode_entry
from sink.forward.sources import SpoolSource
from sink.forward.spool import (
    SpoolReader,
    SpoolWriter,
    frame,
    list_segments,
    read_checkpoint,
    scan_segment,
    seg_name,
    write_checkpoint,
)


def payload(i: int, ts: int | None = None) -> bytes:
    return encode_entry("mqtt.messages", f"t/{i % 3}".encode(), i.to_bytes(4, "big") * (1 + i % 7),
                        [("mqtt.message_id", f"id-{i}".encode())], ts if ts is not None else 1000 + i)


def read_all(d, pos=0):
    r = SpoolReader(d)
    r.seek(pos)
    out = []
    while True:
        got = r.read(1000)
        if not got:
            break
        out.extend(got)
    r.close()
    return out


def ids(recs):
    return [int(decode_entry(p)[2][:4].hex(), 16) for _, _, _, p in recs]


def test_append_group_commit_and_read(tmp_path):
    d = str(tmp_path)
    durable = []
    w = SpoolWriter(d, on_durable=lambda last, n: durable.append((last, n))).open()
    for i in range(2000):
        assert w.append(payload(i)) == i
    w.kick()
    assert w.flush(10)
    w.close()
    assert w.durable_seq == 1999
    assert sum(n for _, n in durable) == 2000
    assert len(durable) < 2000                  # group commit: many records per write + fsync
    assert durable[-1][0] == 1999
    recs = read_all(d)
    assert [r[2] for r in recs] == list(range(2000))
    assert ids(recs) == list(range(2000))
    # positions are contiguous global byte offsets
    for a, b in zip(recs, recs[1:]):
        assert a[1] == b[0]
    assert recs[-1][1] == w.end_pos


def test_segments_roll_and_restart_continues_seq(tmp_path):
    d = str(tmp_path)
    w = SpoolWriter(d, segment_bytes=4096).open()
    for i in range(300):
        w.append(payload(i))
        if i % 50 == 0:
            w.flush()
    w.flush()
    w.close()
    assert len(list_segments(d)) > 3
    w2 = SpoolWriter(d, segment_bytes=4096).open()     # restart: a new segment, seq continues
    assert w2.next_seq == 300
    for i in range(300, 320):
        w2.append(payload(i))
    w2.flush()
    w2.close()
    assert [r[2] for r in read_all(d)] == list(range(320))


@pytest.mark.parametrize("damage", ["torn", "crc", "garbage_length"])
def test_torn_or_corrupt_tail_is_skipped(tmp_path, caplog, damage):
    d = str(tmp_path)
    w = SpoolWriter(d).open()
    for i in range(10):
        w.append(payload(i))
    w.flush()
    w.close()
    seg = os.path.join(d, seg_name(list_segments(d)[-1]))
    last = frame(10, payload(10))
    with open(seg, "ab") as f:
        if damage == "torn":
            f.write(last[: len(last) // 2])                # crash in the middle of a write
        elif damage == "crc":
            f.write(last[:-1] + bytes([last[-1] ^ 0xFF]))  # complete frame, bad CRC
        else:
            f.write(b"\xff\xff\xff\x7f" + b"\x00" * 20)   # implausible length
    assert scan_segment(seg)["status"] in ("torn", "corrupt")
    caplog.set_level(logging.WARNING)
    w2 = SpoolWriter(d).open()                         # must start anyway
    assert "torn/corrupt" in caplog.text
    assert w2.next_seq == 10
    for i in range(10, 15):
        w2.append(payload(i))
    w2.flush()
    w2.close()
    caplog.clear()
    recs = read_all(d)
    assert [r[2] for r in recs] == list(range(15))     # damaged bytes skipped, nothing else lost
    assert "skipping" in caplog.text


def test_reader_waits_on_incomplete_frame_in_live_segment(tmp_path):
    d = str(tmp_path)
    w = SpoolWriter(d).open()
    w.append(payload(0))
    w.flush()
    seg = os.path.join(d, seg_name(list_segments(d)[-1]))
    r = SpoolReader(d)
    assert [x[2] for x in r.read()] == [0]
    f1 = frame(1, payload(1))
    with open(seg, "ab") as f:                         # a write in progress, as seen by the reader
        f.write(f1[:7])
    assert len(r.read()) == 0
    with open(seg, "ab") as f:
        f.write(f1[7:])
    assert [x[2] for x in r.read()] == [1]
    w.close()


def test_checkpoint_and_replay_of_unforwarded(tmp_path):
    d = str(tmp_path)
    w = SpoolWriter(d).open()
    for i in range(100):
        w.append(payload(i))
    w.flush()
    w.close()
    recs = read_all(d)
    write_checkpoint(d, {"pos": recs[60][0], "seq": 60, "kafka": {"topic_ids": {"mqtt.messages": "x"}}})
    assert read_checkpoint(d)["seq"] == 60
    src = SpoolSource(d, 1 << 30)
    pos, seq, kstate = src.load()
    assert (pos, seq) == (recs[60][0], 60) and kstate["topic_ids"] == {"mqtt.messages": "x"}
    assert [r[2] for r in src.read(1000, 1 << 30)] == list(range(60, 100))
    # writer restart reports the backlog from the checkpoint
    w = SpoolWriter(d).open()
    assert (w.ckpt_seq, w.next_seq) == (60, 100)
    assert w.end_pos - w.ckpt_pos == recs[-1][1] - recs[60][0]
    w.close()


def test_unreadable_checkpoint_replays_everything(tmp_path, caplog):
    d = str(tmp_path)
    w = SpoolWriter(d).open()
    for i in range(5):
        w.append(payload(i))
    w.flush()
    w.close()
    with open(os.path.join(d, "checkpoint.json"), "w") as f:
        f.write("{not json")
    src = SpoolSource(d, 1 << 30)
    src.load()
    assert [r[2] for r in src.read(100, 1 << 30)] == list(range(5))


def test_replay_window_position_and_retention(tmp_path):
    d = str(tmp_path)
    now = int(time.time() * 1000)
    w = SpoolWriter(d, segment_bytes=2048).open()
    for i in range(200):                               # first 100 are 2 hours old
        w.append(payload(i, ts=now - 7_200_000 if i < 100 else now))
        if i % 20 == 19:
            w.flush()
    w.flush()
    w.close()
    recs = read_all(d)
    end = recs[-1][1]
    src = SpoolSource(d, 1 << 30)
    src.load()
    # window 1h: starts at the first recent record; window of 30 messages: the last 30
    assert src.find_position(0, now - 3_600_000, end) == recs[100][0]
    assert src.find_position(170, now - 3_600_000, end) == recs[170][0]
    # retention: all forwarded; a 1h window keeps the segments holding recent records
    nsegs = len(list_segments(d))
    src.reader.seek(end)
    src.housekeeping(end, 200, 3600, 1_000_000)
    left = list_segments(d)
    assert 1 < len(left) < nsegs
    assert min(r[2] for r in read_all(d, left[0])) <= 100
    src.housekeeping(end, 200, 0, 0)                   # no window: only the live segment stays
    assert len(list_segments(d)) == 1


def test_unforwarded_segments_are_never_deleted(tmp_path):
    d = str(tmp_path)
    w = SpoolWriter(d, segment_bytes=1024).open()
    for i in range(100):
        w.append(payload(i))
        w.flush()
    w.close()
    recs = read_all(d)
    src = SpoolSource(d, 1 << 30)
    src.load()
    src.reader.seek(recs[50][0])
    src.housekeeping(recs[50][0], 50, 0, 0)
    assert [r[2] for r in read_all(d)][0] <= 50 and [r[2] for r in read_all(d)][-1] == 99


@pytest.mark.asyncio
async def test_sink_barrier_without_kafka(tmp_path):
    """submit/barrier never wait for Kafka: durable acks while Kafka is unreachable."""
    from kafka_client.embedded import free_port
    from sink.forward.service import Sink
    s = Sink.from_config({"bootstrap_servers": f"127.0.0.1:{free_port()}", "forwarder": "thread",
                          "drain_timeout_seconds": 0.5}, str(tmp_path))
    s.start()
    try:
        assert s.barrier() is None
        t0 = time.perf_counter()
        for _ in range(500):
            assert s.submit(SinkRecord(topic="a/b", payload=b"x", qos=1, retain=False, client_id="c",
                                       username=None, protocol=5, accepted_at_ms=int(time.time() * 1000)))
        submit_us = (time.perf_counter() - t0) / 500 * 1e6
        fut = s.barrier()
        assert fut is not None and s.barrier() is fut
        await asyncio.wait_for(fut, 5)
        assert s.barrier() is None
        st = s.stats()
        assert st["accepted"] == st["spooled"] == 500 and st["forwarded"] == 0
        assert st["spool_messages"] == 500 and st["spool_bytes"] > 0
        assert submit_us < 200, submit_us
    finally:
        s.close()
    # everything is still on disk for the next start
    w = SpoolWriter(os.path.join(str(tmp_path), "spool")).open()
    assert w.next_seq - w.ckpt_seq == 500
    w.close()
