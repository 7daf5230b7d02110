"""Dashboard pieces without sockets: topic filter -> regex, time ranges, payload previews,
the bounded per-topic counter, the job's Spark Connect settings."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.dashboard import settings as dashboard_settings
from broker.dashboard.history import BadRequest, check_filter, filter_regex, make_query
from broker.dashboard.live import preview
from mqtt_topics import matches, valid_topic_filter, valid_topic_name

LEVEL = st.text(alphabet="ab$.*()[]\\^é+ \n", max_size=3)
NAME_LEVEL = st.text(alphabet="ab$.*()[]\\^é \n", max_size=3)


@st.composite
def filters(draw):
    levels = draw(st.lists(st.one_of(st.just("+"), NAME_LEVEL), min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


@given(filters(), st.lists(NAME_LEVEL, min_size=1, max_size=5).map("/".join))
@settings(max_examples=500, deadline=None)
def test_filter_regex_matches_exactly_what_the_broker_matches(filt, topic):
    if not valid_topic_filter(filt) or not valid_topic_name(topic):
        return
    assert bool(re.fullmatch(filter_regex(filt), topic)) == matches(filt, topic)


@pytest.mark.parametrize("filt, topic, want", [
    ("sensors/#", "sensors", True), ("sensors/#", "sensors/a/b", True), ("#", "$SYS/x", False),
    ("+/x", "$SYS/x", False), ("$SYS/#", "$SYS/x", True), ("a/+", "a/", True),
    ("a.b/+", "axb/c", False), ("a/(x|y)", "a/x", False), ("a/\\1", "a/\\1", True),
])
def test_filter_regex_examples(filt, topic, want):
    assert bool(re.fullmatch(filter_regex(filt), topic)) is want


def test_filter_checks():
    assert check_filter("a/+/b") == "a/+/b"
    for bad in ("", None, "a/#/b", "a+", "$share/g/a", "a\x00b", "x" * 70000):
        with pytest.raises(BadRequest):
            check_filter(bad)


def test_time_ranges():
    q = make_query("a/#", "2026-05-01T10:00:00Z", "2026-05-01T11:00:00Z", 31)
    assert (q.start, q.end) == (1777629600.0, 1777633200.0)
    assert q.end - q.start <= q.bucket * 240
    assert q.params["d0"] == q.params["d1"] == "2026-05-01" and q.params["t0"] == 1777629600000
    q = make_query("a", None, None, 31, now=1777633200.0)   # default: the last hour
    assert (q.start, q.end) == (1777629600.0, 1777633200.0)
    q = make_query("a", "1777629600000", "1777633200", 31)  # epoch ms and s
    assert (q.start, q.end) == (1777629600.0, 1777633200.0)
    q = make_query("a", "2026-05-01T10:00:00", "2026-05-03T10:00:00+02:00", 31)  # no zone = UTC
    assert q.end - q.start == 2 * 86400 - 7200 and q.params["d1"] == "2026-05-03"
    with pytest.raises(BadRequest, match="empty time range"):
        make_query("a", "2026-05-01T10:00:00Z", "2026-05-01T10:00:00Z", 31)
    with pytest.raises(BadRequest, match="longer than 1 days"):
        make_query("a", "2026-05-01T10:00:00Z", "2026-05-03T10:00:00Z", 1)


@given(st.floats(min_value=0.001, max_value=3e7))
def test_buckets_keep_points_per_chart_bounded(span):
    q = make_query("a", "0", str(span), 400)
    assert q.bucket >= 1 and (span / q.bucket <= 240 or q.bucket == 604800)


@given(st.binary(max_size=600), st.integers(min_value=4, max_value=300))
def test_preview_is_text_or_base64_and_bounded(payload, limit):
    p = preview(payload, limit)
    assert p["bytes"] == len(payload) and p["truncated"] == (len(payload) > limit)
    if "text" in p:
        assert payload.startswith(p["text"].encode()) and len(p["text"].encode()) <= limit
    else:
        import base64
        assert base64.b64decode(p["base64"]) == payload[:limit]


def test_preview_keeps_text_cut_inside_a_character():
    assert preview("é".encode() * 10, 5) == {"text": "éé", "truncated": True, "bytes": 20}


def test_dashboard_settings():
    from settings import DashboardConfig, HistoryConfig, load
    history = HistoryConfig(connect_host="0.0.0.0", connect_port=15123, table="/data/h")
    s = dashboard_settings(DashboardConfig(), history)
    assert s.connect_url == "sc://127.0.0.1:15123" and s.host == "127.0.0.1"
    assert dashboard_settings(DashboardConfig(connect_url="sc://h:1"), history).connect_url == \
        "sc://h:1"
    assert load(None, env={}, sets=["dashboard.allowed_hosts=a, b"]).dashboard.allowed_hosts == \
        ("a", "b")
    for bad, word in (({"nope": 1}, "dashboard.nope"), ({"port": "x"}, "dashboard.port"),
                      ({"enabled": "yes"}, "dashboard.enabled"),
                      ({"connect_url": "http://x"}, "connect_url"),
                      ({"allowed_hosts": [1]}, "dashboard.allowed_hosts"),
                      ({"users": ["alice"]}, "dashboard.users")):  # device users no longer log in
        with pytest.raises(ValueError, match=word):
            DashboardConfig.from_table(bad)


def test_job_connect_settings():
    from sink.history.job import config_from_args, connect_conf
    cfg, _ = config_from_args(["--connect-port", "15555"])
    assert connect_conf(cfg) == {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": "15555"}
    assert connect_conf(config_from_args(["--no-connect"])[0]) == {}
    assert connect_conf(config_from_args(["--available-now"])[0]) == {}


def test_job_config_file_connect_keys(tmp_path):
    from sink.history.job import load_job
    f = tmp_path / "b.toml"
    f.write_text('[history]\nconnect = false\nconnect_host = "0.0.0.0"\nconnect_port = 16000\n')
    h = load_job(str(f))[0].history
    assert (h.connect, h.connect_host, h.connect_port) == (False, "0.0.0.0", 16000)
    f.write_text('[history]\nconnect_port = 70000\n')
    from settings import ConfigError
    with pytest.raises(ConfigError, match="history.connect_port = 70000"):
        load_job(str(f))


def test_job_refuses_a_taken_connect_port():
    import socket

    from sink.history.job import UsageError, check_connect_port, config_from_args
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        cfg, _ = config_from_args(["--connect-port", str(s.getsockname()[1])])
        with pytest.raises(UsageError, match="--connect-port"):
            check_connect_port(cfg)


def test_query_connect_url_parsing():
    from sink.history.query import connect_address, connect_reachable
    assert connect_address("sc://h:15002") == ("h", 15002)
    assert connect_address("sc://[::1]:15002/;token=x") == ("::1", 15002)
    for bad in ("h:15002", "sc://h", "sc://h:x"):
        with pytest.raises(ValueError):
            connect_address(bad)
    from tests.conftest import free_port
    assert connect_reachable(f"sc://127.0.0.1:{free_port()}") is False


def test_basic_auth_header_parsing():
    import base64

    from broker.dashboard.api import _basic
    enc = lambda raw: "Basic " + base64.b64encode(raw).decode()  # noqa: E731
    assert _basic(enc(b"alice:pa:ss")) == ("alice", b"pa:ss")
    assert _basic(enc("jörg:é".encode())) == ("jörg", "é".encode())
    for bad in ("", "Bearer x", "Basic", "Basic !!!", enc(b"no-colon"), enc(b"\xff:x")):
        assert _basic(bad) == (None, None)


def test_history_connection_loss_reads_as_job_not_running():
    from broker.dashboard.history import question
    from broker.dashboard.history_worker import Worker

    class Gone:
        def sql(self, *a, **k):
            raise RuntimeError("<_MultiThreadedRendezvous status = StatusCode.UNAVAILABLE>")

        def stop(self):
            pass
    w = Worker("sc://127.0.0.1:1")
    w._session = lambda: Gone()
    assert w.answer(question(make_query("a/#", None, None, 31))) == {"error": "not_running"}


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-1", "1e400", "1e300",
                                   "2026-13-01T00:00:00Z", "tuesday", "10:00"])
def test_malformed_times_are_bad_requests(value):
    from broker.dashboard.history import parse_time
    with pytest.raises(BadRequest, match="'from' must be a time"):
        parse_time(value, "from")


@pytest.mark.parametrize("header, name", [
    ("localhost:18083", "localhost"), ("LOCALHOST", "localhost"), ("[::1]:18083", "::1"),
    ("127.0.0.1", "127.0.0.1"), ("example.com.", "example.com"), ("a:b", None),
    ("[::1", None), ("[::1]x", None), ("", None), (None, None)])
def test_host_header_names(header, name):
    from broker.dashboard.api import request_host
    assert request_host(header) == name


def test_dashboard_host_names_include_the_bind_address_and_the_configured_ones():
    from broker.dashboard.api import host_names
    names = host_names("10.1.2.3", ("Broker.LAN",))
    assert {"localhost", "127.0.0.1", "::1", "10.1.2.3", "broker.lan"} <= names
    assert "evil.example" not in host_names("0.0.0.0")


def test_history_without_a_spark_client_says_so(monkeypatch):
    """A broker without pyspark (its container image) answers history questions with a message
    saying what is missing (503 through JobNotRunning), not a 500 with a traceback."""
    import sys

    from broker.dashboard.history import question
    from broker.dashboard.history_worker import Worker
    monkeypatch.setitem(sys.modules, "pyspark.sql", None)  # import raises ImportError
    r = Worker("sc://127.0.0.1:1").answer(question(make_query("a/#", None, None, 31)))
    assert r["error"] == "no_spark_client" and "pyspark" in r["detail"]


@pytest.mark.parametrize("origin, host, allowed, ok", [
    (None, "127.0.0.1:9001", (), True),                         # not a browser
    ("http://127.0.0.1:9001", "127.0.0.1:9001", (), True),      # the same host and port
    ("HTTP://Broker.Example:9001/", "broker.example:9001", (), True),
    ("http://127.0.0.1:9002", "127.0.0.1:9001", (), False),     # another port: another site
    ("http://evil.example", "127.0.0.1:9001", (), False),
    ("null", "127.0.0.1:9001", (), False),                      # a sandboxed page or a file
    ("http://evil.example", None, (), False),
    ("https://app.example.com", "127.0.0.1:9001", ("https://app.example.com/",), True),
    ("https://app.example.com.evil.example", "h:1", ("https://app.example.com",), False),
    ("http://evil.example", "h:1", ("*",), True),
])
def test_origin_is_allowed_when_absent_the_same_host_and_port_or_listed(origin, host, allowed, ok):
    """One Origin check for the dashboard and the WebSocket listeners (broker/auth/origin.py)."""
    from broker.auth.origin import origin_allowed
    assert origin_allowed(origin, host, allowed) is ok


class _View:
    """The two BrokerView calls the Sampler makes, with fixed figures."""

    def counters(self) -> dict:
        return {"received_by_qos": [0, 0, 0], "sent_by_qos": [0, 0, 0]}

    def stats(self) -> dict:
        return {"connections": 0, "sessions": 0, "subscriptions": 0, "retained": 0}


@pytest.mark.parametrize("sink, want", [
    ({"lag_seconds": 0.5, "spool_messages": 3, "history_lag_seconds": 12.5}, 12.5),  # keep_until = "history"
    ({"lag_seconds": 0.5, "spool_messages": 3, "history_lag_seconds": None}, None),  # keep_until = "kafka"
])
def test_live_points_carry_the_sinks_history_lag(sink, want):
    """The Lag chart's second line ("history job: since last commit") reads each point's
    history_lag_seconds: the sink's figure, null when the sink does not follow the job."""
    from broker.dashboard.live import Sampler
    s = Sampler(_View(), lambda: (0, 0), 1.0, 10, None, lambda: dict(sink))  # type: ignore[arg-type]
    s.sample()
    p = s.sample()
    assert p["kafka_lag_seconds"] == 0.5 and p["spool_messages"] == 3
    assert "history_lag_seconds" in p and p["history_lag_seconds"] == want
    assert [q["history_lag_seconds"] for q in s.series()] == [want]


def test_live_points_without_a_sink_have_no_lag_figures():
    from broker.dashboard.live import Sampler
    s = Sampler(_View(), lambda: (0, 0), 1.0, 10, None, lambda: {})  # type: ignore[arg-type]
    s.sample()
    p = s.sample()
    assert "kafka_lag_seconds" not in p and "history_lag_seconds" not in p
