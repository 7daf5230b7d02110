"""The broker's table of open connections by deadline (broker/core/timeouts.py): the tick looks
only at connections whose connect timeout or Keep Alive deadline [MQTT-3.1.2-22] has come, and
still closes every one that is due, within a tenth of a second of its deadline."""
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.connection import Connection
from broker.core.timeouts import ConnectionTable
from broker.protocol import packets as P
from broker.protocol import reason_codes as rc
from tests.sansio import Client, expect_disconnect, make, run_for


def spy_on_due(monkeypatch) -> list:
    """The connections the tick looks at (each handed to Connection.look_at), as they come."""
    looked: list = []
    real = ConnectionTable.due

    def due(self, now):
        found = real(self, now)
        looked.extend(found)
        return found
    monkeypatch.setattr(ConnectionTable, "due", due)
    return looked


def test_the_tick_looks_only_at_connections_whose_deadline_came(monkeypatch):
    """1,000 idle clients with Keep Alive 60: ten ticks look at none of them (before: all 1,000
    every tick); at 90 s each is looked at once and, silent, disconnected (0x8D)."""
    b, clock = make()
    clients = []
    for i in range(1000):
        c = Client(b)
        c.connect(f"idle-{i}", keep_alive=60)
        clients.append(c)
    looked = spy_on_due(monkeypatch)
    run_for(b, clock, 10)
    assert looked == [] and len(b.connections) == 1000
    run_for(b, clock, 80.2)  # 90.2 s after the last packet: 1.5 x 60 passed
    assert len(looked) == 1000 and len(b.connections) == 0
    expect_disconnect(clients[0], rc.KEEP_ALIVE_TIMEOUT)


def test_a_client_that_keeps_sending_is_looked_at_once_per_deadline(monkeypatch):
    """A PINGREQ moves the deadline without touching the table: when the old deadline comes the
    connection is looked at, found in time, and filed for the new one."""
    b, clock = make()
    c = Client(b)
    c.connect("busy", keep_alive=10)
    looked = spy_on_due(monkeypatch)
    for _ in range(10):
        run_for(b, clock, 5)
        c.send(P.PingReq())
        c.received()
    assert not c.conn.close_requested and c.conn in b.connections
    assert 2 <= len(looked) <= 4  # 50 s of 15 s deadlines, each pushed on by the PINGREQs
    run_for(b, clock, 15.2)
    expect_disconnect(c, rc.KEEP_ALIVE_TIMEOUT)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 7]), st.floats(0, 30)), min_size=1,
                max_size=12))
def test_every_connection_times_out_as_the_full_scan_did(spec):
    """Clients with various Keep Alives, each sending a PINGREQ every Keep Alive until its own
    time, then silent: at the end exactly those silent for more than 1.5 x Keep Alive are
    disconnected (what looking at every connection every tick gives, within a tick and 0.1 s),
    none earlier, and the table holds exactly the open ones."""
    b, clock = make()
    clients = []
    for i, (ka, _) in enumerate(spec):
        c = Client(b)
        c.connect(f"c{i}", keep_alive=ka)
        clients.append(c)
    start = clock.t
    pings = sorted((k * ka, i) for i, (ka, last) in enumerate(spec) if ka
                   for k in range(1, int(last // ka) + 1))
    for t, i in pings:
        if start + t > clock.t:
            run_for(b, clock, start + t - clock.t)
        assert not clients[i].conn.close_requested  # never before its deadline
        clients[i].send(P.PingReq())
        clients[i].received()
    end = start + 31.2
    run_for(b, clock, end - clock.t)
    for c, (ka, last) in zip(clients, spec):
        silent = end - (start + (last // ka * ka if ka else 0))
        if ka and silent > ka * 1.5 + 1.1:
            assert c.conn.close_requested
        if not ka or silent <= ka * 1.5:
            assert not c.conn.close_requested
        assert (c.conn in b.connections) == (not c.conn.close_requested)
    assert len(b.connections) == sum(1 for c in clients if not c.conn.close_requested)


def test_a_connection_without_connect_is_closed_and_leaves_the_table():
    """mqtt.connect_timeout: a silent connection is closed at its deadline, and the table (the
    broker's set of open connections) no longer holds it."""
    b, clock = make(connect_timeout=2.0)
    conn = Connection(b)
    assert conn in b.connections and len(b.connections) == 1
    b.tick(clock.t + 1.9)
    assert not conn.close_requested
    b.tick(clock.t + 2.1)
    assert conn.close_requested and conn not in b.connections and not b.connections
    assert list(b.connections) == []
