"""Hostile clients: mutated and spliced valid packets fed to the decoder and to the sans-I/O
Connection (tests/fuzzing.py has the corpus, the mutators and the invariants). Bounded to a
few seconds here; bench/fuzz.py runs the same targets for millions of inputs."""
import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import Decoder, encode
from tests import fuzzing as F
from tests.sansio import drain, feed

V4, V5 = P.MQTT_311, P.MQTT_5
FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Inputs the fuzzer once failed on, replayed on every run: (level, bytes sent after a valid
# CONNECT, reason code of the DISCONNECT expected (v5) or None when the connection must just close).
FUZZER_INPUTS = [
    # a second CONNECT with an unknown protocol level: DISCONNECT carried 0x84, a CONNACK-only
    # reason code; a second CONNECT is a Protocol Error [MQTT-3.1.0-2] -> 0x82
    (V5, "10 0d 00 04 4d 51 54 54 07 02 00 3c 00 00 00", rc.PROTOCOL_ERROR),
    (V4, "10 0c 00 04 4d 51 54 54 e7 02 00 3c 00 00", None),
]


@st.composite
def mutated_packets(draw):
    return F.decoder_case(draw(st.randoms(use_true_random=False)))


@st.composite
def hostile_streams(draw):
    return F.core_case(draw(st.randoms(use_true_random=False)))[1]


def test_seed_corpus_is_valid():
    """Every seed decodes cleanly at its level, so mutations start from real packets."""
    for level, seeds in F.SEEDS.items():
        for data in seeds:
            pkts, err = Decoder(level).feed(data)
            assert err is None and len(pkts) == 1, (level, data.hex())
    assert {data[0] >> 4 for data in F.SEEDS[V5]} == set(range(1, 16))  # every packet type
    assert {data[0] >> 4 for data in F.SEEDS[V4]} == set(range(1, 15))


@FUZZ
@given(case=mutated_packets(), rng=st.randoms(use_true_random=False))
@example(case=(V5, bytes.fromhex("30ffffff7f")), rng=random.Random(0))  # the largest length
@example(case=(V5, bytes.fromhex("3080808080")), rng=random.Random(0))  # five-byte length
def test_decoder_reports_only_protocol_errors(case, rng):
    level, data = case
    F.fuzz_decoder(rng, data, level)


@FUZZ
@given(streams=hostile_streams(), rng=st.randoms(use_true_random=False),
       variant=st.sampled_from(range(len(F.CONFIGS))))
@example(streams=[F.CONNECTS[V5][0] + bytes.fromhex(FUZZER_INPUTS[0][1])], rng=random.Random(0),
         variant=0)
def test_connection_survives_hostile_client(streams, rng, variant):
    F.CoreTarget(variant=variant).run(rng, *streams)  # a fresh broker: each example stands alone


@pytest.mark.parametrize("level,hexdata,code", FUZZER_INPUTS)
def test_a_second_connect_is_a_protocol_error_whatever_its_level(level, hexdata, code):
    """A second CONNECT is a Protocol Error [MQTT-3.1.0-2], even with an unknown protocol level
    (v5: DISCONNECT 0x82, not the CONNACK-only 0x84; 3.1.1: the connection closes): the inputs the
    fuzzer once failed on, on a fresh broker, with the exact answer expected."""
    t = F.CoreTarget()
    conn = F.watched(t.broker)
    feed(conn, encode(P.Connect("f", level), level))
    (ack,), _ = Decoder(level).feed(drain(conn))
    assert ack.type == P.CONNACK and ack.reason_code == 0
    feed(conn, bytes.fromhex(hexdata))
    out = drain(conn)
    assert conn.close_requested
    if code is None:
        assert out == b""  # 3.1.1: closed without a DISCONNECT
    else:
        pkts, err = Decoder(level).feed(out)
        assert err is None and [p.type for p in pkts] == [P.DISCONNECT]
        assert pkts[0].reason_code == code
        assert "second CONNECT" in pkts[0].properties[PR.REASON_STRING]  # says what was wrong
    t.run(random.Random(0), F.CONNECTS[level][0] + bytes.fromhex(hexdata))  # the invariants hold
