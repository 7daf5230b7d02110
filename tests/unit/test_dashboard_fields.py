"""A JSON field of the payloads charted by the dashboard: the field path is checked before it
reaches Spark (as a query parameter, never SQL text), and the live extraction skips and counts
payloads that are not JSON, too large, or without the field."""
from __future__ import annotations

import pytest

from broker.dashboard import history
from broker.dashboard.fields import FieldCharts, extract, field_steps
from broker.dashboard.history import BadRequest, check_field, field_json_path, make_query, question


class Msg:
    def __init__(self, topic: str, payload: bytes) -> None:
        self.topic, self.payload = topic, payload


@pytest.mark.parametrize("path", ["temp", "env.temp", "readings[0].value", "a_1.B2[10][3]",
                                  "[0]", "0"])
def test_field_paths_of_names_dots_and_indexes_are_accepted(path):
    assert check_field(path) == path


@pytest.mark.parametrize("path", ["", " ", "temp'", "a..b", "a.", ".a", "a[x]", "a[-1]", "a b",
                                  "$.temp", "temp) OR 1=1 --", "a[0", "a]", "é", "a\nb",
                                  "x" * 201])
def test_field_paths_with_other_characters_are_refused_with_an_example(path):
    with pytest.raises(BadRequest) as e:
        check_field(path)
    assert "e.g." in str(e.value) or "longer than" in str(e.value)


def test_field_reaches_spark_as_a_parameter_never_as_sql_text():
    q = make_query("sensors/+/env", "1000", "4600", 31, now=5000, field="env.temp[2]")
    assert q.params["path"] == "$.env.temp[2]"
    assert question(q)["field"] == "env.temp[2]"
    assert ":path" in history.FIELD_SQL and "env.temp" not in history.FIELD_SQL
    assert "try_variant_get(payload_json, :path, 'double')" in history.FIELD_SQL
    assert field_json_path("[1].x") == "$[1].x"


def test_field_question_checks_the_field_before_anything_is_asked():
    with pytest.raises(BadRequest, match="invalid field path"):
        make_query("sensors/#", None, None, 31, now=5000, field="temp'; DROP TABLE messages")


def test_history_sql_uses_the_schema_column_names():
    from sink.history.schema import HISTORY_COLUMNS
    for name in ("payload_json", "accepted_at", "topic", "date", "payload_text"):
        assert name in HISTORY_COLUMNS
    assert "payload_json" in history.FIELD_SQL and "FROM messages" in history.FIELD_SQL


def test_field_steps_and_extraction():
    assert field_steps("a.b[2][0].c") == ["a", "b", 2, 0, "c"]
    assert field_steps("[1].x") == [1, "x"]
    doc = {"a": {"b": [0, 1, [7.5]]}, "t": True, "s": "21", "n": None}
    assert extract(doc, field_steps("a.b[2][0]")) == 7.5
    for path in ("a.b[9]", "a.x", "t", "s", "n", "a", "a.b.c", "a[0]"):
        assert extract(doc, field_steps(path)) is None
    assert extract({"big": 10 ** 400}, ["big"]) is None   # beyond a double: skipped, no error


def test_live_field_chart_skips_and_counts_bad_json_without_failing():
    now = [0.0]
    fc = FieldCharts(max_charts=2, max_payload_bytes=128, keep=10, clock=lambda: now[0])
    chart = fc.watch("sensors/+", "temp")
    for payload in (b'{"temp": 20}', b'{"temp": 22.5}', b"{not json", b"\xff\xfe\x00",
                    b"[" * 50 + b"]" * 50, b'{"temp": "warm"}', b'{"humidity": 3}',
                    b'{"temp": ' + b"1" * 200 + b"}", b'{"temp": 1e999}'):
        assert fc.on_message_accepted(Msg("sensors/a", payload), "c", None, 5) is True
    fc.on_message_accepted(Msg("other/a", b'{"temp": 99}'), "c", None, 5)  # filter: no match
    fc.sample(1_000_000.0)
    a = chart.answer()
    assert [p[1:] for p in a["points"]] == [[21.25, 20.0, 22.5, 2]]
    assert a["skipped_bad_json"] == 2
    assert a["skipped_too_large"] == 1
    assert a["missing_field"] == 4   # "warm", no temp, 1e999 (inf), the nested array
    fc.sample(1_000_002.0)           # nothing since: no point
    assert len(chart.answer()["points"]) == 1
    assert chart.answer(since=1_000_000.0)["points"] == []


def test_live_field_charts_are_bounded_and_idle_ones_make_room():
    now = [0.0]
    fc = FieldCharts(max_charts=2, max_payload_bytes=1024, keep=3, clock=lambda: now[0],
                     idle_seconds=60)
    fc.watch("a/#", "x")
    fc.watch("b/#", "x")
    with pytest.raises(BadRequest, match="max_field_charts"):
        fc.watch("c/#", "x")
    fc.watch("a/#", "x")          # asked again: stays
    now[0] = 61.0
    fc.watch("a/#", "x")
    fc.watch("c/#", "x")          # b/# idle for 61 s: gone
    assert set(fc.charts) == {("a/#", "x"), ("c/#", "x")}
    with pytest.raises(BadRequest, match="invalid topic filter"):
        fc.watch("a/#/b", "x")
    c = fc.charts[("a/#", "x")]
    for i in range(5):                # points kept: at most keep
        fc.on_message_accepted(Msg("a/1", b'{"x": %d}' % i), "c", None, 5)
        fc.sample(1000.0 + i)
    assert [p[1] for p in c.points] == [2.0, 3.0, 4.0]


def test_no_live_field_chart_means_no_payload_is_parsed(monkeypatch):
    fc = FieldCharts(max_charts=2, max_payload_bytes=1024, keep=3)
    import broker.dashboard.fields as fields
    monkeypatch.setattr(fields.json, "loads", lambda *_: pytest.fail("parsed"))
    assert fc.on_message_accepted(Msg("a", b"{}"), "c", None, 5) is True
