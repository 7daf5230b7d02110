"""Sparkplug B payloads (made by Eclipse Tahu's Node encoder: tests/fixtures/sparkplug/) ->
rows of sparkplug_metrics: every datatype, alias resolution through births and rebirths, a
restart (maps read back from the birth rows), malformed payloads counted."""
from __future__ import annotations

import base64
import datetime as dt
import json
import struct
from pathlib import Path

import pytest

from sink.history.sparkplug import sparkplug_b_pb2 as pb
from sink.history.sparkplug.aliases import Aliases
from sink.history.sparkplug.batch import COLUMNS, decode_batch
from sink.history.sparkplug.decode import Malformed, parse, parse_topic

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sparkplug"
MESSAGES = {m["name"]: m for m in json.loads((FIXTURES / "messages.json").read_text())}
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def fixture(name: str, i: int = 0) -> tuple[str, str, bytes, dt.datetime]:
    """(message_id, topic, payload, accepted_at) of a fixture, accepted i seconds after T0."""
    return (f"m-{name}", MESSAGES[name]["topic"], (FIXTURES / f"{name}.bin").read_bytes(),
            T0 + dt.timedelta(seconds=i))


def rows_of(*names: str, aliases: Aliases | None = None) -> list[dict]:
    out = decode_batch([fixture(n, i) for i, n in enumerate(names)], aliases or Aliases())
    return [dict(zip(COLUMNS, r)) for r in out.rows]


def value(row: dict):
    return None if row["value_json"] is None else json.loads(row["value_json"])


def test_every_datatype_of_a_birth_reads_back_as_the_encoder_was_given():
    """Sparkplug 3.0 section 6.4.16 (datatypes): signed integers from their two's complement,
    unsigned ones, Float, Double, Boolean, String, Text, UUID, DateTime, Bytes, DataSet,
    Template, and is_null: each metric's value equals the encoder's input."""
    rows = {r["metric"]: r for r in rows_of("nbirth")}
    given = {m["name"]: m for m in MESSAGES["nbirth"]["input"]["metrics"]}
    assert set(rows) == set(given)
    for name, m in given.items():
        r = rows[name]
        assert r["datatype"] == m["type"], name
        assert r["alias"] == m["alias"], name
        want = m["value"]
        if m["type"] in ("Int64", "UInt64"):
            want = int(want)
        elif m["type"] == "Bytes":
            want = base64.b64encode(bytes(want)).decode()
        elif m["type"] == "DataSet":
            want = {"columns": want["columns"], "types": want["types"], "rows": want["rows"]}
        elif m["type"] == "Template":
            want = {"template_ref": "Motor", "version": "1.0", "is_definition": False,
                    "metrics": [{"name": "rpm", "datatype": "Int32", "value": 1200},
                                {"name": "on", "datatype": "Boolean", "value": True}],
                    "parameters": [{"name": "maker", "type": "String", "value": "ACME"}]}
        assert value(r) == want, name
        assert r["metric_timestamp"] == dt.datetime.fromtimestamp(1_700_000_000, dt.timezone.utc)
    assert rows["i64"]["value_json"] == "-9000000000"
    assert rows["pressure"]["value_json"] == "1013.25e0"   # a double for parse_json, not a decimal
    assert rows["missing"]["value_json"] is None
    assert {r["seq"] for r in rows.values()} == {0}
    assert {(r["group_id"], r["message_type"], r["edge_node_id"], r["device_id"])
            for r in rows.values()} == {("plant1", "NBIRTH", "edge1", None)}


def test_data_with_aliases_only_is_named_by_the_last_birth_of_its_node_or_device():
    """Sparkplug 3.0 section 6.4.2 (aliases): DATA metrics carrying only an alias get the name
    the birth gave it; the node's map names node metrics, the device's its own."""
    rows = rows_of("nbirth", "dbirth", "ndata", "ddata")
    ndata = [r for r in rows if r["message_type"] == "NDATA"]
    assert [(r["metric"], r["alias"], r["datatype"], value(r)) for r in ndata] == [
        ("temp", 2, "Int32", -7), ("pressure", 3, "Double", 990.5), (None, 99, "Int64", 42)]
    ddata = [r for r in rows if r["message_type"] == "DDATA"]
    assert [(r["metric"], r["device_id"], value(r)) for r in ddata] == [
        ("ready", "dev1", False), ("level", "dev1", 3.5)]
    assert {r["message_id"] for r in ddata} == {"m-ddata"}
    assert {r["seq"] for r in ddata} == {3}


def test_a_rebirth_replaces_the_alias_map_from_its_place_on():
    """A second NBIRTH gives alias 2 to pressure (temp had it before) and temp alias 50: DATA
    before it keeps the old names, DATA after it gets the new ones."""
    rows = rows_of("nbirth", "ndata", "nbirth2", "ndata2")
    before = {r["alias"]: r["metric"] for r in rows if r["message_id"] == "m-ndata"}
    after = {r["alias"]: r["metric"] for r in rows if r["message_id"] == "m-ndata2"}
    assert before[2] == "temp"
    assert after == {50: "temp", 2: "pressure"}


def test_data_whose_birth_was_never_seen_keeps_its_alias_and_no_name():
    rows = rows_of("orphan")
    assert [(r["edge_node_id"], r["metric"], r["alias"], r["datatype"], value(r)) for r in rows] == [
        ("edge9", None, 5, "Int32", 1)]


def test_commands_and_deaths_are_rows_too_and_a_death_without_metrics_has_none():
    rows = rows_of("nbirth", "dbirth", "dcmd", "ncmd", "ddeath", "ndeath")
    by_type = {}
    for r in rows:
        by_type.setdefault(r["message_type"], []).append(r)
    assert [(r["metric"], r["device_id"], value(r)) for r in by_type["DCMD"]] == [("ready", "dev1", True)]
    assert [(r["metric"], value(r)) for r in by_type["NCMD"]] == [("Node Control/Rebirth", True)]
    assert [(r["metric"], value(r)) for r in by_type["NDEATH"]] == [("bdSeq", 7)]
    assert "DDEATH" not in by_type


def test_aliases_read_back_from_the_birth_rows_resolve_as_before_a_restart():
    """The job's restart: the maps rebuilt from the table's birth rows (two births of edge1,
    stored in any order) name the next DATA as the running job would."""
    running = Aliases()
    first = decode_batch([fixture(n, i) for i, n in enumerate(["nbirth", "dbirth", "nbirth2"])],
                         running)
    continued = decode_batch([fixture("ndata2", 10), fixture("ddata", 11)], running)
    births = [dict(zip(COLUMNS, r)) for r in first.rows]
    from sink.history.sparkplug.decode import TYPE_NAMES
    codes = {v: k for k, v in TYPE_NAMES.items()}
    stored = [{**{k: r[k] for k in ("group_id", "edge_node_id", "device_id", "message_id",
                                     "accepted_at", "metric", "alias")},
               "datatype_code": codes.get(r["datatype"])} for r in reversed(births)]
    after = decode_batch([fixture("ndata2", 10), fixture("ddata", 11)], Aliases.from_births(stored))
    assert after.rows == continued.rows
    assert [r[4] for r in after.rows] == ["temp", "pressure", "ready", "level"]


def test_a_malformed_payload_is_counted_and_the_other_messages_still_decode():
    bad = [("m-bad", "spBv1.0/plant1/NDATA/edge1", b"\xff\xff\xff\xff", T0),
           ("m-empty", "spBv1.0/plant1/NDATA/edge1", b"", T0),
           ("m-text", "spBv1.0/plant1/DDATA/edge1/dev1", b"{\"temp\": 1}", T0)]
    out = decode_batch([fixture("nbirth", 0), *bad, fixture("ndata", 5)], Aliases())
    assert [m for m, _, _ in out.malformed] == ["m-bad", "m-empty", "m-text"]
    assert all("not a Sparkplug B payload" in why for _, _, why in out.malformed)
    assert out.messages == 2
    assert {r[10] for r in out.rows} == {"m-nbirth", "m-ndata"}


def test_topics_outside_the_sparkplug_b_node_and_device_messages_are_not_decoded():
    """Sparkplug 3.0 section 4.1: spBv1.0/<group>/<type>/<edge>[/<device>]; STATE and other
    shapes are not metric payloads here."""
    assert parse_topic("spBv1.0/g/NDATA/e") is not None
    assert parse_topic("spBv1.0/g/DDATA/e/d").device_id == "d"
    for topic in ("spBv1.0/STATE/host", "spBv1.0/g/NDATA/e/d", "spBv1.0/g/DDATA/e",
                  "spBv1.0/g/XDATA/e", "spAv1.0/g/NDATA/e", "sensors/1", "spBv1.0//NDATA/e"):
        assert parse_topic(topic) is None, topic
    out = decode_batch([("m", "sensors/1", b"\xff", T0)], Aliases())
    assert out.rows == [] and out.malformed == [] and out.messages == 0


def _array_payload(datatype: int, raw: bytes) -> bytes:
    p = pb.Payload(timestamp=1)
    p.metrics.add(name="a", datatype=datatype, bytes_value=raw)
    return p.SerializeToString()


@pytest.mark.parametrize("datatype,raw,want", [
    (22, struct.pack("<3b", -1, 0, 127), [-1, 0, 127]),                 # Int8Array
    (23, struct.pack("<2h", -300, 300), [-300, 300]),                   # Int16Array
    (24, struct.pack("<2i", -70000, 70000), [-70000, 70000]),           # Int32Array
    (25, struct.pack("<q", -(2 ** 40)), [-(2 ** 40)]),                  # Int64Array
    (26, bytes([0, 255]), [0, 255]),                                    # UInt8Array
    (27, struct.pack("<H", 65535), [65535]),                            # UInt16Array
    (28, struct.pack("<I", 4_000_000_000), [4_000_000_000]),            # UInt32Array
    (29, struct.pack("<Q", 2 ** 64 - 1), [2 ** 64 - 1]),                # UInt64Array
    (30, struct.pack("<2f", 0.1, -2.5), [0.1, -2.5]),                   # FloatArray
    (31, struct.pack("<2d", 0.1, 1e300), [0.1, 1e300]),                 # DoubleArray
    (32, struct.pack("<I", 10) + bytes([0b10110000, 0b01000000]),       # BooleanArray
     [True, False, True, True, False, False, False, False, False, True]),
    (33, b"ab\0\xc3\xa9\0", ["ab", "é"]),                               # StringArray
    (34, struct.pack("<q", 1_700_000_000_000), [1_700_000_000_000]),    # DateTimeArray
])
def test_array_datatypes_are_json_arrays(datatype, raw, want):
    """Sparkplug 3.0 section 6.4.17: arrays in bytes_value, little-endian (Tahu's Node encoder
    has none: built here with struct)."""
    (m,) = parse(_array_payload(datatype, raw)).metrics
    assert m.value == want


def test_an_array_whose_bytes_do_not_fit_its_type_is_malformed():
    with pytest.raises(Malformed):
        parse(_array_payload(24, b"\x00\x01\x02"))


def test_a_batch_s_staged_files_give_its_sparkplug_messages_in_accepted_order(tmp_path):
    """What the job's writer decodes: the Sparkplug B topic rows of the batch's staged messages
    files (two hours, Kafka partitions out of accept order), oldest first; none when the batch
    has none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sink.history.sparkplug.table import read_messages

    def write(hour: int, rows: list[tuple[str, str, int, int]]) -> None:
        d = tmp_path / "out" / "date=2026-01-01" / f"_h={hour}"
        d.mkdir(parents=True)
        pq.write_table(pa.table({
            "message_id": [r[0] for r in rows], "topic": [r[1] for r in rows],
            "payload": [r[0].encode() for r in rows],
            "accepted_at": pa.array([T0 + dt.timedelta(seconds=r[2]) for r in rows],
                                    pa.timestamp("us")),
            "kafka_partition": pa.array([r[3] for r in rows], pa.int32()),
            "kafka_offset": pa.array(range(len(rows)), pa.int64())}), d / "part-0.parquet")
    assert read_messages(tmp_path / "out") == []
    write(1, [("a", "sensors/1", 3600, 0), ("b", "spBv1.0/g/NDATA/e", 3601, 1)])
    write(0, [("c", "spBv1.0/g/NBIRTH/e", 5, 2), ("d", "spBv1.0/g/NDATA/e", 5, 0),
              ("e", "spBv1.0", 6, 0)])
    got = read_messages(tmp_path / "out")
    assert [(m, topic, payload) for m, topic, payload, _ in got] == [
        ("d", "spBv1.0/g/NDATA/e", b"d"), ("c", "spBv1.0/g/NBIRTH/e", b"c"),
        ("b", "spBv1.0/g/NDATA/e", b"b")]
    assert got[0][3] == T0 + dt.timedelta(seconds=5)
    (tmp_path / "none").mkdir()
    write_none = tmp_path / "none" / "date=2026-01-01" / "_h=0"
    write_none.mkdir(parents=True)
    pq.write_table(pa.table({"message_id": ["x"], "topic": ["sensors/2"], "payload": [b""],
                             "accepted_at": pa.array([T0], pa.timestamp("us")),
                             "kafka_partition": pa.array([0], pa.int32()),
                             "kafka_offset": pa.array([0], pa.int64())}), write_none / "p.parquet")
    assert read_messages(tmp_path / "none") == []


def test_the_alias_maps_kept_are_bounded_and_the_least_recently_used_go_first():
    """[history] sparkplug_max_nodes: a client publishing births for ever new edge nodes cannot
    grow the job's memory without bound; a forgotten node's DATA keeps its alias, no name."""
    aliases = Aliases(max_keys=2)
    decode_batch([fixture("nbirth", 0), fixture("dbirth", 1)], aliases)
    decode_batch([fixture("ndata", 2)], aliases)            # edge1 used after dev1's birth
    other = ("m-x", "spBv1.0/plant1/NBIRTH/edge7", (FIXTURES / "nbirth2.bin").read_bytes(), T0)
    decode_batch([other], aliases)                           # a third: dev1 is forgotten
    assert aliases.forgotten == 1 and len(aliases) == 2
    rows = [dict(zip(COLUMNS, r)) for r in decode_batch([fixture("ddata", 5), fixture("ndata", 6)],
                                                        aliases).rows]
    assert [(r["message_type"], r["metric"], r["alias"]) for r in rows] == [
        ("DDATA", None, 30), ("DDATA", None, 31),
        ("NDATA", "temp", 2), ("NDATA", "pressure", 3), ("NDATA", None, 99)]
    # read back after a restart with the same bound: the two born last
    births = [{"group_id": g, "edge_node_id": e, "device_id": d, "message_id": f"b{i}",
               "accepted_at": T0 + dt.timedelta(seconds=i), "metric": "x", "alias": 1,
               "datatype_code": 3} for i, (g, e, d) in enumerate(
        [("g", "e1", None), ("g", "e2", None), ("g", "e3", None)])]
    assert set(Aliases.from_births(births, max_keys=2).maps) == {("g", "e2", None), ("g", "e3", None)}
