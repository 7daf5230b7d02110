"""SpoolReader.read returns a SpoolBatch: named fields over parallel lists; its bounds hold."""
from hypothesis import given, settings
from hypothesis import strategies as st

from sink.forward.spool import FRAME_SIZE, SpoolEntry, SpoolReader, SpoolWriter


@settings(max_examples=25, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=60),
       st.lists(st.tuples(st.integers(1, 20), st.integers(1, 2000)), min_size=1, max_size=10),
       st.integers(256, 4096))
def test_batches_cover_the_spool_in_order_within_their_bounds(tmp_path_factory, payloads, reads, seg_bytes):
    d = str(tmp_path_factory.mktemp("spool"))
    w = SpoolWriter(d, segment_bytes=seg_bytes, fsync=False).open()
    for p in payloads:
        w.append(p)
        if len(p) % 3 == 0:
            w.flush()                       # several segments, of several writes
    w.flush()
    w.close()
    r = SpoolReader(d)
    got: list[SpoolEntry] = []
    i = 0
    while True:
        n, nbytes = reads[i % len(reads)]
        i += 1
        b = r.read(n, nbytes)
        if not b:
            break
        assert len(b) <= n
        entries = list(b)
        assert sum(e.end - e.start for e in entries[:-1]) < nbytes     # the byte bound stops a read
        assert (b.start, b.end, b.first_seq, b.last_seq) == (entries[0].start, entries[-1].end,
                                                             entries[0].seq, entries[-1].seq)
        assert b[len(b) - 1] == entries[-1] and r.pos == b.end
        got += entries
    r.close()
    assert [e.payload for e in got] == payloads and [e.seq for e in got] == list(range(len(payloads)))
    for e in got:
        assert e.end - e.start == FRAME_SIZE + len(e.payload)
    assert got[-1].end == w.end_pos
