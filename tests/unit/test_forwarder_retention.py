"""keep_until = "history": the forwarder's committed position follows the job's committed file
(sink/history/commits.py) over acknowledged chunks, never past one the table does not have."""
from hypothesis import given, settings
from hypothesis import strategies as st

from settings import SinkConfig
from sink.forward.commit_watch import AckedChunk, CommitWatcher
from sink.forward.forwarder import Forwarder, Runtime, ThreadControl
from sink.forward.sources import MemorySource
from sink.history import commits


def fwd(tmp_path):
    f = Forwarder(SinkConfig(keep_until="history"),
                  Runtime(spool_dir="", data_dir="", bootstrap="127.0.0.1:1", committed_file=str(tmp_path / "c.json")),
                  MemorySource(1 << 20), ThreadControl(), lambda st: None)
    f.acked_pos, f.acked_seq = 300, 30
    f.source.end_pos = 300
    f.source._read_seq = 0
    # three acknowledged chunks: spool end position, next seq, {(topic, partition): next offset}, ids
    f.commits.pending.extend([AckedChunk(100, 10, {("m", 0): 10}, {"m": "A"}),
                              AckedChunk(200, 20, {("m", 0): 15, ("m", 1): 5}, {"m": "A"}),
                              AckedChunk(300, 30, {("m", 1): 15}, {"m": "A"})])
    return f


def commit(tmp_path, offsets, tid="A"):
    commits.write_committed(str(tmp_path / "c.json"), 1, {"m": {"topic_id": tid, "offsets": offsets}})


def test_committed_position_follows_the_table(tmp_path):
    f = fwd(tmp_path)
    f._advance_committed()
    assert (f.commits.committed_pos, f.commits.committed_seq) == (0, 0)        # no file yet: nothing committed
    commit(tmp_path, {0: 15, 1: 4})
    f._advance_committed()
    assert (f.commits.committed_pos, f.commits.committed_seq) == (100, 10)     # chunk 2 needs partition 1 up to 5
    commit(tmp_path, {0: 15, 1: 5}, tid="B")                   # another topic incarnation: not ours
    f._advance_committed()
    assert f.commits.committed_pos == 100
    commit(tmp_path, {0: 15, 1: 15})
    f._advance_committed()
    assert (f.commits.committed_pos, f.commits.committed_seq) == (300, 30) and not f.commits.pending
    assert f.retained() == (300, 30)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.dictionaries(st.tuples(st.sampled_from("ab"), st.integers(0, 2)), st.integers(1, 10**6),
                                max_size=4), min_size=1, max_size=600),
       st.integers(1, 300))
def test_merging_the_pending_list_is_conservative(chunks, limit):
    """However the list is shortened (checkpoint size), a merged entry is committed only when
    every chunk in it is."""
    f = CommitWatcher(None)
    for i, d in enumerate(chunks):
        f.acked(AckedChunk((i + 1) * 10, i + 1, dict(d), {"a": "X", "b": "X"}))
    orig = list(f.pending)
    f.merge_pending(limit)
    assert len(f.pending) <= max(limit, 1)
    assert (f.pending[-1].end, f.pending[-1].next_seq) == (orig[-1].end, orig[-1].next_seq)
    # each merged entry covers the chunks up to its end, with offsets at least theirs
    j = 0
    for c in f.pending:
        while j < len(orig) and orig[j].end <= c.end:
            for tp, n in orig[j].offsets.items():
                assert c.offsets[tp] >= n
            j += 1
    assert j == len(orig)
