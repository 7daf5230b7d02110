"""sink/history/dedup.py: the history job's duplicate-id ledger, without Spark or Kafka."""
from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sink.history.dedup import (
    Ledger,
    LedgerStore,
    TaskFilter,
    contains,
    load_ledger,
    merge,
    offsets_key,
    parse_ids,
    to_intervals,
    write_task_summary,
)


def _columns(ids: list) -> tuple:
    """ids (bytes or None) -> (data, start, length) as kafka_client.recordbatch gives them."""
    data, start, length, pos = b"", [], [], 0
    for i in ids:
        start.append(pos)
        length.append(-1 if i is None else len(i))
        if i is not None:
            data += i
            pos += len(i)
    return (np.frombuffer(data or b"\0", np.uint8), np.array(start, np.int64),
            np.array(length, np.int64))


def _keys(ids: list) -> list:
    group, seq, keys = parse_ids(*_columns(ids))
    return [None if g < 0 else (keys[g], int(s)) for g, s in zip(group, seq)]


def test_parse_ids_table():
    got = _keys([b"65f0a1b2c3d4-1", b"65f0a1b2c3d4-ff", b"p-01", b"p-1", b"-a", b"x-A", b"x-",
                 b"nodash", None, b"", b"q-" + b"f" * 15, b"q-" + b"f" * 16, b"a-b-c"])
    assert got == [((b"65f0a1b2c3d4", 1), 1), ((b"65f0a1b2c3d4", 2), 255),
                   ((b"p", 2), 1), ((b"p", 1), 1),   # "p-01" and "p-1" are different ids
                   ((b"", 1), 10), None, None, None, None, None,
                   ((b"q", 15), 16 ** 15 - 1), None, ((b"a-b", 1), 12)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=24),
                          st.builds(lambda p, n, w: p + b"-" + format(n, "x").zfill(w).encode(),
                                    st.sampled_from([b"", b"a", b"65f0a1b2c3d4", b"a-b"]),
                                    st.integers(0, 2 ** 62), st.integers(0, 18))),
                min_size=1, max_size=40))
def test_parse_ids_is_injective_and_reads_our_form(ids):
    """Two different ids never get the same (group, n): nothing is ever dropped by mistake."""
    keys = _keys(ids)
    seen: dict = {}
    for i, k in zip(ids, keys):
        if k is not None:
            assert seen.setdefault(k, i) == i
            (prefix, digits), n = k
            assert i == prefix + b"-" + format(n, "x").zfill(digits).encode()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sets(st.integers(0, 300)), min_size=1, max_size=6),
       st.lists(st.integers(-5, 310), max_size=50))
def test_intervals_match_sets(chunks, probes):
    iv, union = (np.zeros(0, np.int64), np.zeros(0, np.int64)), set()
    for c in chunks:
        iv = merge(iv, to_intervals(np.array(sorted(c), np.int64)))
        union |= c
    s, e = iv
    assert all(s[1:] > e[:-1] + 1)  # disjoint, not adjacent: as few intervals as possible
    got = contains(iv, np.array(probes, np.int64))
    assert list(got) == [p in union for p in probes]


def test_consecutive_ids_stay_one_interval_and_gaps_cost_one_each():
    led, rng = Ledger(), np.random.default_rng(1)
    ids = np.arange(1, 1_000_001, dtype=np.int64)
    lost = np.sort(rng.choice(ids, 7, replace=False))
    ids = np.setdiff1d(ids, lost)
    for chunk in np.array_split(rng.permutation(ids), 50):   # any arrival order
        led.add((b"p", 5), to_intervals(np.unique(chunk)), 1)
    assert led.intervals() == 8  # 1,000,000 ids with 7 gaps: 8 intervals
    assert not led.seen((b"p", 5), lost).any()


def test_expiry_drops_idle_groups_and_bounds_their_number():
    led = Ledger()
    for i in range(10):
        led.add((b"g%d" % i, 1), (np.array([1]), np.array([5])), ms=i * 1000)
    assert led.expire(now_ms=9000, window_ms=4500, max_groups=100) == 5  # last seen before 4500
    assert [k[0] for k in led.groups] == [b"g5", b"g6", b"g7", b"g8", b"g9"]
    led.add((b"g5", 1), (np.array([9]), np.array([9])), ms=9500)  # seen again: most recent
    assert led.expire(now_ms=9500, window_ms=10_000, max_groups=3) == 2
    assert [k[0] for k in led.groups] == [b"g8", b"g9", b"g5"]


def test_task_filter_drops_ledger_and_earlier_copies_keeps_foreign_ids():
    led = Ledger()
    led.add((b"p", 1), (np.array([1]), np.array([3])))
    tf = TaskFilter(led)
    keep = tf.keep(*_columns([b"p-1", b"p-4", b"p-4", b"uuid-Z", b"uuid-Z", None, None, b"p-5"]))
    assert list(keep) == [False, True, False, True, True, True, True, True]
    keep = tf.keep(*_columns([b"p-5", b"p-6", b"p-3"]))  # a later fetch of the same task
    assert list(keep) == [False, True, False]
    assert tf.dropped == 4
    s, e = tf.summary()[(b"p", 1)]
    assert (list(s), list(e)) == ([4], [6])


def _offsets(n: int) -> dict:
    return {"t": {"mqtt.messages": {"0": n}}, "ids": {"mqtt.messages": "abc"}}


def _run_batch(store: LedgerStore, start: dict, end: dict, tasks: list, ts: int) -> list:
    """Plan (start, end) and run its tasks (each a list of fetches of ids). -> ids kept."""
    ledger_path, bdir = store.prepare(start, end, ts)
    kept = []
    for t, fetches in enumerate(tasks):
        tf = TaskFilter(load_ledger(ledger_path))
        for ids in fetches:
            keep = tf.keep(*_columns(ids))
            kept += [i for i, k in zip(ids, keep) if k]
        write_task_summary(bdir, f"task{t}", tf.summary())
    return kept


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_id_once_across_batches_crashes_and_restarts(tmp_path_factory, data):
    """Kafka replays (copies of earlier ids, in later batches) and re-runs of a batch after a
    crash (a new planning process, same offsets): each id reaches the table exactly once."""
    d = str(tmp_path_factory.mktemp("dedup"))
    rng = random.Random(data.draw(st.integers(0, 10 ** 6)))
    prefixes = [b"65f0aa%02d" % i for i in range(data.draw(st.integers(1, 3)))]
    counters = {p: 0 for p in prefixes}
    sent: list = []
    table: list = []
    store = LedgerStore(d)
    pos = 0
    for b in range(data.draw(st.integers(1, 8))):
        batch = []
        for _ in range(rng.randint(0, 40)):
            if sent and rng.random() < 0.3:
                batch.append(rng.choice(sent))              # a replayed or retried copy
            else:
                p = rng.choice(prefixes)
                counters[p] += 1
                if rng.random() < 0.1:
                    counters[p] += 1                        # an id lost before Kafka (a gap)
                batch.append(b"%s-%x" % (p, counters[p]))
        sent += batch
        # copies of one id share a Kafka key, so a partition, so a task: split by id
        tasks: dict = {}
        for i in batch:
            tasks.setdefault(hash(i) % 3, []).append(i)
        fetches = [[ids[:len(ids) // 2], ids[len(ids) // 2:]] for ids in tasks.values()]
        start, end = _offsets(pos), _offsets(pos + len(batch) + 1)
        pos += len(batch) + 1
        if rng.random() < 0.3:  # crash mid-batch: the attempt's rows are never committed
            _run_batch(store, start, end, fetches[:1], ts=b)
            store = LedgerStore(d)                          # a new planning process
        table += _run_batch(store, start, end, fetches, ts=b)
        if rng.random() < 0.3:
            store = LedgerStore(d)                          # restart between batches
    assert sorted(table) == sorted(set(sent))


def test_state_files_do_not_accumulate(tmp_path):
    store = LedgerStore(str(tmp_path))
    for b in range(20):
        _run_batch(store, _offsets(b), _offsets(b + 1), [[[b"p-%x" % (b + 1)]]], ts=b)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"batch-{offsets_key(_offsets(20))}", f"ledger-{offsets_key(_offsets(19))}.pkl"]
    led = store._ledger_for(offsets_key(_offsets(19)))
    assert led.intervals() == 2  # ids 1..f (one hex digit) and 10..13 (two): one interval each
    assert led.seen((b"p", 1), np.array([1, 15])).all()
    assert led.seen((b"p", 2), np.array([16, 19, 20])).tolist() == [True, True, False]


def test_missing_state_means_duplicates_may_pass_never_drops(tmp_path):
    store = LedgerStore(str(tmp_path / "a"))
    kept = _run_batch(store, _offsets(0), _offsets(1), [[[b"p-1"]]], ts=0)
    other = LedgerStore(str(tmp_path / "b"))  # state lost
    kept += _run_batch(other, _offsets(1), _offsets(2), [[[b"p-1", b"p-2"]]], ts=1)
    assert kept == [b"p-1", b"p-1", b"p-2"]


def test_window_expires_an_idle_prefix(tmp_path):
    store = LedgerStore(str(tmp_path), window_ms=10)
    assert _run_batch(store, _offsets(0), _offsets(1), [[[b"old-1", b"new-1"]]], ts=0) == [b"old-1", b"new-1"]
    assert _run_batch(store, _offsets(1), _offsets(2), [[[b"new-2"]]], ts=20) == [b"new-2"]
    # planning batch 3 merged batch 2 (ts 20): "old" last seen at 0 < 20 - 10 is forgotten
    assert _run_batch(store, _offsets(2), _offsets(3), [[[b"old-1", b"new-1"]]], ts=21) == [b"old-1"]


def test_job_uses_the_source_for_new_local_checkpoints_only(tmp_path):
    from sink.history.job import DEDUP_MARKER, Job, dedup_in_source
    new = Job.of(table=str(tmp_path / "t1"))
    assert dedup_in_source(new)
    old = Job.of(table=str(tmp_path / "t2"))   # made with Spark's operator, before sink.history.dedup
    (tmp_path / "t2_checkpoint" / "offsets").mkdir(parents=True)
    (tmp_path / "t2_checkpoint" / "offsets" / "0").write_text("v1")
    assert not dedup_in_source(old)
    (tmp_path / "t2_checkpoint" / DEDUP_MARKER).write_text("source\n")
    assert dedup_in_source(old)
    assert not dedup_in_source(Job.of(table="s3a://bucket/history"))  # tasks write locally
    assert Job.of(dedup_window=" 36 hours ").history.dedup_window_ms == 36 * 3600 * 1000


def test_bounds_reach_the_source_and_the_spool_writer(tmp_path):
    from settings import HistoryConfig, SinkConfig
    from sink.forward.spool import SpoolWriter
    from sink.history.source import SourceOptions
    opts = SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t",
                                "dedup.dir": str(tmp_path), "dedup.maxGroups": "7",
                                "dedup.windowMs": "1000"})
    assert (opts.dedup_dir, opts.dedup_max_groups, opts.dedup_window_ms) == (str(tmp_path), 7, 1000)
    assert HistoryConfig().dedup_max_prefixes == 100_000 == opts.__class__.dedup_max_groups
    assert SinkConfig().spool_group_commit_ms == 2.0
    assert SpoolWriter(str(tmp_path), fsync=True, group_commit=0.0).group_commit == 0.0
    assert SpoolWriter(str(tmp_path), fsync=False).group_commit == 0.0  # no sync, no wait
