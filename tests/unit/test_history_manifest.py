"""The history table's commit log (sink/history/manifest.py), compaction planning and retention,
without Spark: what a reader sees through Spark's log (``_spark_metadata/<N>.compact``) is always
one committed version, every row in exactly one live file, across concurrent writers and
crashes between the steps of a commit."""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sink.history.compaction import Policy, plan, survey
from sink.history.maintenance import describe
from sink.history.manifest import (
    KEEP_VERSIONS,
    Change,
    Conflict,
    FileEntry,
    OutsideTable,
    Removed,
    Snapshot,
    Table,
    file_uri,
    staged_files,
)
from sink.history.retention import expired_dates, first_kept_date, parse_duration, retention_change

H = 3_600_000
DAY = 24 * H
T0 = 1_714_521_600_000  # 2024-05-01T00:00:00Z


class Clock:
    def __init__(self, t=T0):
        self.t = t

    def __call__(self):
        return self.t


def entry(path, date="2024-05-01", hour=0, size=100, rows=10, level=0, batch=None):
    return FileEntry(path=f"date={date}/{path}", date=date, hour=hour, size=size, rows=rows,
                     level=level, batch=batch)


def spark_view(table: Table) -> list[str]:
    """The files a Spark reader plans with: the newest _spark_metadata/<N>.compact (as Spark's
    CompactibleFileStreamLog picks it: the highest batch id), checked to be a compact file."""
    ids = table.spark_log_ids()
    if not ids:
        return []
    latest = table.spark_log / f"{max(ids)}.compact"
    lines = latest.read_text().splitlines()
    assert lines[0] == "v1"
    root = file_uri(table.root) + "/"
    out = []
    for line in lines[1:]:
        d = json.loads(line)
        assert d["action"] == "add" and d["path"].startswith(root)
        out.append(d["path"][len(root):])
    return out


def test_appends_are_versions_and_spark_reads_the_newest(tmp_path):
    t = Table(tmp_path / "h", clock=Clock())
    assert t.snapshot().id == -1 and spark_view(t) == []
    v0 = t.commit(Change("append", add=[entry("a.parquet")], stream={"id": "q", "batch": 0}))
    v1 = t.commit(Change("append", add=[entry("b.parquet", hour=1)],
                         stream={"id": "q", "batch": 1}))
    assert (v0.id, v1.id) == (0, 1)
    snap = t.snapshot()
    assert snap.paths == {"date=2024-05-01/a.parquet", "date=2024-05-01/b.parquet"}
    assert snap.stream_batch("q") == 1 and snap.stream_batch("other-checkpoint") == -1
    assert sorted(spark_view(t)) == sorted(snap.paths)
    # every version is a compact file: Spark derives the log's interval (1) from the two newest
    assert sorted(os.listdir(t.spark_log)) == ["0.compact", "1.compact"]
    assert snap.rows == 20 and Snapshot.from_json(snap.to_json()) == snap


def test_a_writer_that_lost_the_race_commits_on_top_of_the_winner(tmp_path):
    t = Table(tmp_path / "h", clock=Clock())
    t.commit(Change("append", add=[entry("a.parquet"), entry("b.parquet")]))
    other = Table(tmp_path / "h", clock=Clock())
    raced = []

    def compaction(base):
        if not raced:  # another writer commits version base.id + 1 first
            raced.append(other.commit(Change("append", add=[entry("c.parquet", hour=5)])))
        return Change("compact", add=[entry("ab.parquet", level=1)],
                      remove=["date=2024-05-01/a.parquet", "date=2024-05-01/b.parquet"])

    new = t.commit(compaction)
    assert raced[0].id == 1 and new.id == 2
    assert t.snapshot().paths == {"date=2024-05-01/ab.parquet", "date=2024-05-01/c.parquet"}
    assert sorted(spark_view(t)) == sorted(t.snapshot().paths)


def test_a_compaction_whose_inputs_are_gone_is_refused(tmp_path):
    t = Table(tmp_path / "h", clock=Clock())
    t.commit(Change("append", add=[entry("a.parquet"), entry("b.parquet")]))
    t.commit(Change("compact", add=[entry("ab.parquet")],
                    remove=["date=2024-05-01/a.parquet", "date=2024-05-01/b.parquet"]))
    with pytest.raises(Conflict):
        t.commit(Change("compact", add=[entry("ab2.parquet")],
                        remove=["date=2024-05-01/a.parquet", "date=2024-05-01/b.parquet"]))
    assert t.snapshot().paths == {"date=2024-05-01/ab.parquet"}


def test_removed_files_are_deleted_after_the_delay_only(tmp_path):
    clock = Clock()
    t = Table(tmp_path / "h", delete_delay_ms=600_000, clock=clock)
    for name in ("a.parquet", "b.parquet"):
        p = t.abs(f"date=2024-05-01/{name}")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    t.commit(Change("append", add=[entry("a.parquet"), entry("b.parquet")]))
    t.commit(Change("compact", add=[entry("ab.parquet")],
                    remove=["date=2024-05-01/a.parquet", "date=2024-05-01/b.parquet"]))
    clock.t += 599_999
    assert t.expire_removed() is None  # a query planned before the compaction may still read them
    assert t.abs("date=2024-05-01/a.parquet").exists()
    clock.t += 1
    assert t.expire_removed() is not None
    assert not t.abs("date=2024-05-01/a.parquet").exists()
    assert t.snapshot().removed == [] and t.expire_removed() is None


def test_a_missing_spark_log_file_is_written_before_the_next_version(tmp_path):
    """A writer killed between its manifest and its Spark log file: the next writer writes the
    missing file first, so Spark's log has no gap (a gap makes Spark's reader fail)."""
    t = Table(tmp_path / "h", clock=Clock())
    t.commit(Change("append", add=[entry("a.parquet")]))
    t.commit(Change("append", add=[entry("b.parquet")]))
    (t.spark_log / "1.compact").unlink()
    assert spark_view(t) == ["date=2024-05-01/a.parquet"]  # the previous version: consistent
    t.commit(Change("append", add=[entry("c.parquet")]))
    assert t.spark_log_ids() == [0, 1, 2]
    (t.spark_log / "2.compact").unlink()
    assert t.repair_spark_log() == 1
    assert len(spark_view(t)) == 3


def test_old_versions_are_deleted_keeping_a_contiguous_tail(tmp_path):
    t = Table(tmp_path / "h", clock=Clock())
    for i in range(KEEP_VERSIONS + 15):
        t.commit(Change("append", add=[entry(f"f{i}.parquet")]))
    newest = KEEP_VERSIONS + 14
    ids = t.spark_log_ids()
    assert ids == list(range(newest - KEEP_VERSIONS, newest + 1))
    assert len(os.listdir(t.manifests)) == KEEP_VERSIONS + 1
    # what a query reads to plan: the newest version only, proportional to the live files
    assert len(spark_view(t)) == newest + 1


def test_orphans_are_unlisted_files_older_than_the_limit(tmp_path):
    clock = Clock(T0 + 10 * H)
    t = Table(tmp_path / "h", clock=clock)
    d = t.root / "date=2024-05-01"
    d.mkdir(parents=True)
    for name in ("live.parquet", "orphan.parquet", "fresh.parquet"):
        (d / name).write_bytes(b"x")
    os.utime(d / "live.parquet", (T0 / 1000, T0 / 1000))
    os.utime(d / "orphan.parquet", (T0 / 1000, T0 / 1000))
    os.utime(d / "fresh.parquet", (clock.t / 1000, clock.t / 1000))
    t.commit(Change("append", add=[entry("live.parquet")]))
    assert t.orphans() == [d / "orphan.parquet"]
    assert t.delete_orphans() == 1 and (d / "fresh.parquet").exists()


def test_staged_files_know_their_day_and_hour(tmp_path):
    p = tmp_path / "date=2024-05-01" / "_h=7" / "part-0.parquet"
    p.parent.mkdir(parents=True)
    p.write_bytes(b"")
    q = tmp_path / "date=2024-05-02" / "part-1.parquet"
    q.parent.mkdir(parents=True)
    q.write_bytes(b"")
    assert sorted(staged_files(tmp_path)) == [(p, "2024-05-01", 7), (q, "2024-05-02", None)]


# ---- compaction planning ------------------------------------------------------------------

def test_plan_closed_day_closed_hour_and_full_open_hour():
    pol = Policy(target_bytes=1000, grace_ms=300_000, open_max_files=4)
    files = ([entry(f"d1-{i}.parquet", "2024-05-01", hour=i % 3) for i in range(5)]
             + [entry("d1-big.parquet", "2024-05-01", hour=1, size=900)]
             + [entry(f"h0-{i}.parquet", "2024-05-02", hour=0) for i in range(2)]
             + [entry(f"h1-{i}.parquet", "2024-05-02", hour=1) for i in range(3)]
             + [entry(f"h2-{i}.parquet", "2024-05-02", hour=2) for i in range(4)]
             + [entry("lone.parquet", "2024-05-02", hour=3)])
    snap = Snapshot(id=0, files=files)
    now = T0 + DAY + 2 * H + 600_000  # 2024-05-02 02:10
    tasks = plan(snap, now, pol)
    got = [(t.date, t.hour, t.reason, len(t.inputs)) for t in tasks]
    assert got == [("2024-05-01", None, "closed day", 5),   # the big file is left alone
                   ("2024-05-02", 0, "closed hour", 2),
                   ("2024-05-02", 1, "closed hour", 3),
                   ("2024-05-02", 2, "open hour", 4)]
    # within the grace after its end an hour is still open (hour 1 at 02:01), and a day too
    assert [(t.date, t.hour) for t in plan(snap, T0 + DAY + 2 * H + 100_000, pol)] == \
        [("2024-05-01", None), ("2024-05-02", 0), ("2024-05-02", 2)]
    assert [(t.date, t.hour) for t in plan(snap, T0 + DAY + 100_000, pol)] == \
        [("2024-05-01", 0), ("2024-05-01", 1), ("2024-05-02", 2)]  # hour 2 of 05-01: 1 file
    # a compacted table needs nothing more
    done = Snapshot(id=1, files=[entry("c.parquet", "2024-05-01", None, 2000),
                                 entry("d.parquet", "2024-05-02", None, 10)])
    assert plan(done, now + 10 * DAY, pol) == []


def test_a_pass_says_which_files_it_left_and_why():
    """Every file is either in a task or counted as left, for a reason sink.maintain prints:
    still-open hours (with the grace and the open-hour threshold), already large, or alone."""
    pol = Policy(target_bytes=1000, grace_ms=300_000, open_max_files=4)
    files = ([entry("d1-big.parquet", "2024-05-01", hour=1, size=900)]
             + [entry("d1-lone.parquet", "2024-05-01", hour=2)]
             + [entry(f"h2-{i}.parquet", "2024-05-02", hour=2) for i in range(3)]
             + [entry("whole.parquet", "2024-05-02", hour=None)])
    now = T0 + DAY + 2 * H + 600_000  # 2024-05-02 02:10: hour 2 of 05-02 still open
    tasks, left = survey(Snapshot(id=0, files=files), now, pol)
    assert tasks == []
    assert left == {"large": 1, "alone": 1, "open": 4}
    text = describe({"version": 7, "files": 6, "rows": 60, "bytes": 1500, "left": left,
                     "compaction": {"tasks": 0}}, pol)
    assert text.startswith("version 7: 6 files, 60 rows")
    assert "compacted nothing" in text
    assert "4 in hours or days still open" in text and "grace of 5 min" in text
    assert "at 4 small files" not in text and "reaches 4 small files" in text
    assert "1 already at least half the target size" in text
    assert "1 alone in a closed hour or day" in text


# ---- retention ----------------------------------------------------------------------------

def test_retention_drops_whole_days_once_all_their_rows_are_past_it():
    assert parse_duration("400d") == 400 * DAY and parse_duration("12 hours") == 12 * H
    assert parse_duration("") is None
    for bad in ("400", "d", "-1d", "0d", "3 fortnights"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    snap = Snapshot(id=0, files=[entry("a.parquet", "2024-05-01"),
                                 entry("b.parquet", "2024-05-02"),
                                 entry("c.parquet", "2024-05-03")])
    # 2 days kept: at 2024-05-04 00:00 the cutoff is 05-02 00:00 = the end of 05-01
    now = T0 + 3 * DAY
    assert expired_dates(snap, now, 2 * DAY) == ["2024-05-01"]
    assert expired_dates(snap, now - 1, 2 * DAY) == []
    assert expired_dates(snap, now, None) == []
    assert str(first_kept_date(now, 2 * DAY)) == "2024-05-02"
    change = retention_change(now, 2 * DAY)(snap)
    assert change.remove == ["date=2024-05-01/a.parquet"]


# ---- every row exactly once, whatever the interleaving -----------------------------------

ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 47), st.integers(1, 3)),
    st.tuples(st.just("compact"), st.integers(0, 47), st.integers(2, 5)),
    st.tuples(st.just("retention"), st.integers(0, 3), st.integers(0, 0)),
    st.tuples(st.just("crash"), st.integers(0, 0), st.integers(0, 0)),
    st.tuples(st.just("race"), st.integers(0, 47), st.integers(1, 2)),
), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
@example([("append", 0, 1), ("append", 24, 2), ("compact", 24, 2), ("retention", 1, 0)])
def test_every_row_is_in_exactly_one_live_file_through_any_history(tmp_path_factory, steps):
    """Appends, compactions of an hour's files, retention, a writer killed between its manifest
    and its Spark log file, and another writer committing first: at every step Spark's view is
    a committed version in which every row not expired is in exactly one file."""
    root = tmp_path_factory.mktemp("t")
    clock = Clock(T0 + 3 * DAY)
    t = Table(root / "h", clock=clock)
    content: dict[str, set] = {}   # file -> the row ids in it (the model)
    expected: set = set()
    n = [0]

    def new_file(date, hour, rows, level=0):
        n[0] += 1
        e = entry(f"f{n[0]}.parquet", date, hour, rows=len(rows), level=level)
        content[e.path] = set(rows)
        return e

    def day_hour(slot):
        return (f"2024-05-0{1 + slot // 24 % 2}", slot % 24)

    for op, a, b in steps:
        if op == "append" or op == "race":
            date, hour = day_hour(a)
            files = []
            for _ in range(b):
                rows = {f"r{n[0]}-{i}" for i in range(3)}
                files.append(new_file(date, hour, rows))
            if op == "race":  # another writer's append lands between our read and our commit
                other = Table(root / "h", clock=clock)
                extra = new_file(date, hour, {f"x{n[0]}"})
                first = []

                def change(base, files=files, extra=extra, other=other, first=first):
                    if not first:
                        first.append(other.commit(Change("append", add=[extra])))
                    return Change("append", add=files)
                t.commit(change)
                files = files + [extra]
            else:
                t.commit(Change("append", add=files))
            for f in files:
                expected |= content[f.path]
        elif op == "compact":
            date, hour = day_hour(a)
            inputs = [f for f in t.snapshot().files if (f.date, f.hour) == (date, hour)][:b]
            if len(inputs) >= 2:
                merged = set().union(*(content[f.path] for f in inputs))
                out = new_file(date, hour, merged, level=1)
                t.commit(Change("compact", add=[out], remove=[f.path for f in inputs]))
        elif op == "retention":
            clock.t += a * DAY
            before = set(t.snapshot().paths)
            dropped = t.commit(retention_change(clock.t, 3 * DAY))
            if dropped:  # the rows of the files this commit removed (not of files compacted away)
                for p in before - set(t.snapshot().paths):
                    expected -= content[p]
        elif op == "crash":  # killed after the manifest, before its Spark log file
            ids = t.spark_log_ids()
            if ids and max(ids) == t.snapshot().id and t.snapshot().id > 0:
                (t.spark_log / f"{max(ids)}.compact").unlink()
        view = spark_view(t)
        newest = t.snapshot()
        if max(t.spark_log_ids(), default=-1) == newest.id:
            assert sorted(view) == sorted(newest.paths)
            rows = [r for p in view for r in content[p]]
            assert set(rows) == expected              # none missing
            assert newest.rows == len(rows)
        else:  # a writer died before its Spark log file: readers see the version before
            assert sorted(view) == sorted(t.read(newest.id - 1).paths)
            rows = [r for p in view for r in content[p]]
        assert len(rows) == len(set(rows))            # no row twice
    ids = t.spark_log_ids()
    assert ids == list(range(ids[0], ids[-1] + 1)) if ids else True  # contiguous


@pytest.mark.parametrize("name", ["date=2024-05-01/../../victim.parquet", "../victim.parquet",
                                  "/ABS/victim.parquet", "date=2024-05-01/./../../victim.parquet",
                                  "link/victim.parquet"])
def test_a_manifest_naming_a_file_outside_the_table_never_deletes_it(tmp_path, name):
    """Every path a manifest names is resolved against the table and refused unless it stays
    inside it: a crafted ``removed`` entry (``..`` steps, an absolute path, a directory that is
    a symbolic link out) is forgotten by the next commit, the file it names is left alone."""
    clock = Clock()
    victim = tmp_path / "victim.parquet"
    victim.write_bytes(b"not the table's")
    t = Table(tmp_path / "h", delete_delay_ms=600_000, clock=clock)
    (tmp_path / "h").mkdir()
    os.symlink(tmp_path, tmp_path / "h" / "link")
    name = name.replace("/ABS", str(tmp_path))
    p = t.root / "date=2024-05-01" / "a.parquet"
    p.parent.mkdir(parents=True)
    p.write_bytes(b"x")
    t.commit(Change("append", add=[entry("a.parquet")]))
    crafted = t.snapshot()
    crafted.id += 1
    crafted.removed = [Removed(name, T0 - 3_600_000)]
    (t.manifests / f"{crafted.id}.json").write_bytes(crafted.to_json())
    clock.t += 1
    assert t.expire_removed() is not None
    assert victim.read_bytes() == b"not the table's"
    assert t.snapshot().removed == [] and p.exists()
    with pytest.raises(OutsideTable):
        t.abs(name)


def test_a_manifest_naming_a_live_file_outside_the_table_is_neither_read_nor_listed(tmp_path):
    """A live entry leading out of the table is refused before Spark's log lists it (a query
    would read it) and before compaction or retention could take it."""
    t = Table(tmp_path / "h")
    t.commit(Change("append", add=[]))
    with pytest.raises(OutsideTable):
        t.commit(Change("append", add=[FileEntry("date=2024-05-01/../../../etc/passwd",
                                                 "2024-05-01", 0, 1, 1)]))
    assert spark_view(t) == []
