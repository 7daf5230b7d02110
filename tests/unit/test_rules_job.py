"""The history job's rules, without Spark: a result row as JSON, which rules the store's changes
start, stop and retry (a fake clock), the store watcher, the status lines."""
from __future__ import annotations

import datetime as dt
import decimal
import json
import os

from settings import rules as R
from settings.rules import RuleSpec
from sink.history.rules.rowjson import row_json
from sink.history.rules.runner import StoreWatch, broker_address, status_of
from sink.history.rules.supervise import BACKOFF_FIRST, FAILED, PAUSED, RUNNING, Supervisor


class FakeVariant:
    def __init__(self, text: str) -> None:
        self.text = text

    def toJson(self, zone: str = "UTC") -> str:
        return self.text


class FakeHandle:
    def __init__(self, rows: int = 0) -> None:
        self.rows, self.last_row_at = rows, None

    def input_rate(self) -> float:
        return 12.5


def spec(name: str = "hot", sql: str = "SELECT * FROM messages", paused: bool = False) -> RuleSpec:
    return RuleSpec(name, sql, publish="alerts/hot", paused=paused, source=R.STORE)


def test_a_row_is_a_json_object_of_its_columns_variant_as_json_timestamps_iso_utc():
    row = {"topic": "t/1", "temp": 31.5, "n": 3, "ok": True, "none": None,
           "payload_json": FakeVariant('{"temp":31.5,"tags":["a"]}'),
           "accepted_at": dt.datetime(2024, 5, 2, 10, 0, 0, 250000),
           "day": dt.date(2024, 5, 2), "raw": b"\x00\xff", "avg": decimal.Decimal("1.25"),
           "nan": float("nan"),
           "window": {"start": dt.datetime(2024, 5, 2, 10, 0), "end": dt.datetime(2024, 5, 2, 10, 1)}}
    got = json.loads(row_json(row))
    assert list(got) == list(row)   # the row's column order
    assert got == {"topic": "t/1", "temp": 31.5, "n": 3, "ok": True, "none": None,
                   "payload_json": {"temp": 31.5, "tags": ["a"]},
                   "accepted_at": "2024-05-02T10:00:00.250Z", "day": "2024-05-02", "raw": "AP8=",
                   "avg": 1.25, "nan": None,
                   "window": {"start": "2024-05-02T10:00:00.000Z", "end": "2024-05-02T10:01:00.000Z"}}


def test_new_rules_start_removed_and_paused_ones_stop_a_changed_one_restarts():
    sup = Supervisor()
    stop, start = sup.step([spec("a"), spec("b")], now=0)
    assert (stop, [s.name for s in start]) == ([], ["a", "b"])
    sup.started("a", FakeHandle(), 0)
    sup.started("b", FakeHandle(), 0)
    assert sup.step([spec("a"), spec("b")], now=1) == ([], [])     # nothing changed: nothing done
    stop, start = sup.step([spec("a", paused=True), spec("b", sql="SELECT topic FROM messages")], 2)
    assert sorted(stop) == ["a", "b"] and [s.name for s in start] == ["b"]
    assert sup.entries["a"].state == PAUSED
    sup.stopped("a")
    sup.started("b", FakeHandle(), 2)
    stop, start = sup.step([spec("a")], 3)        # b removed, a resumed
    assert stop == ["b"] and [s.name for s in start] == ["a"] and "b" not in sup.entries


def test_a_rule_whose_sql_fails_stays_failed_until_changed_and_others_go_on():
    sup = Supervisor()
    sup.step([spec("bad", sql="SELEKT"), spec("good")], 0)
    sup.failed("bad", "PARSE_SYNTAX_ERROR", 0, permanent=True)
    sup.started("good", FakeHandle(), 0)
    assert sup.step([spec("bad", sql="SELEKT"), spec("good")], 1000) == ([], [])
    assert sup.entries["bad"].state == FAILED and sup.entries["good"].state == RUNNING
    _, start = sup.step([spec("bad", sql="SELECT 1 FROM messages"), spec("good")], 1001)
    assert [s.name for s in start] == ["bad"]


def test_a_rule_that_dies_running_is_retried_with_a_growing_backoff():
    sup = Supervisor()
    sup.step([spec()], 0)
    sup.started("hot", FakeHandle(), 0)
    sup.failed("hot", "connection refused", 10)
    assert sup.step([spec()], 10 + BACKOFF_FIRST - 0.1) == ([], [])
    assert [s.name for s in sup.step([spec()], 10 + BACKOFF_FIRST)[1]] == ["hot"]
    sup.failed("hot", "connection refused", 20)     # failed to start again: twice as long
    assert sup.step([spec()], 20 + BACKOFF_FIRST * 2 - 0.1) == ([], [])
    assert len(sup.step([spec()], 20 + BACKOFF_FIRST * 2)[1]) == 1


def test_the_store_is_read_again_when_its_file_changes_and_a_bad_file_keeps_the_last(tmp_path):
    d = str(tmp_path)
    w = StoreWatch(d)
    assert w.poll().rules == []
    R.write_store(d, R.Store([spec("a")], set()))
    assert [r.name for r in w.poll().rules] == ["a"]
    with open(R.store_path(d), "w") as f:
        f.write("{not json")
    os.utime(R.store_path(d), ns=(1, 1))
    assert [r.name for r in w.poll().rules] == ["a"] and "cannot be read" in w.error
    R.write_store(d, R.Store([spec("a"), spec("b")], {"a"}))
    store = w.poll()
    assert [r.name for r in store.rules] == ["a", "b"] and store.paused == {"a"} and not w.error


def test_status_lines_say_state_rows_rate_and_last_error(tmp_path):
    sup = Supervisor()
    sup.step([spec("a"), spec("b"), spec("c", paused=True)], 0)
    h = FakeHandle(rows=10)
    sup.started("a", h, 0)
    sup.failed("b", "cannot reach the broker", 0)
    rates: dict = {}
    first = status_of(sup, 100.0, rates)
    h.rows = 30
    second = status_of(sup, 110.0, rates)
    assert second["a"]["state"] == "running" and second["a"]["rows"] == 30
    assert second["a"]["rows_per_second"] == 2.0 and second["a"]["input_rows_per_second"] == 12.5
    assert first["b"] == {**first["b"], "state": "failed", "last_error": "cannot reach the broker"}
    assert second["c"]["state"] == "paused"
    R.write_status(str(tmp_path), second)
    assert R.read_status(str(tmp_path))["rules"]["a"]["rows"] == 30


def test_the_job_publishes_to_the_brokers_listener_on_loopback_when_it_listens_everywhere():
    from sink.history.job.config import Job
    assert broker_address(Job(broker_host="0.0.0.0", broker_port=1884)) == ("127.0.0.1", 1884)
    assert broker_address(Job(broker_host="10.0.0.5", broker_port=1883)) == ("10.0.0.5", 1883)


def test_the_job_learns_the_brokers_port_and_the_rules_watermark_from_the_config(tmp_path):
    from sink.history.job.config import load_job
    cfg = tmp_path / "broker.toml"
    cfg.write_text('[broker]\nhost = "0.0.0.0"\nport = 1884\n[history]\nrules_watermark = "2 minutes"\n'
                   '[[history.rules]]\nname = "hot"\nsql = "SELECT topic FROM messages"\n'
                   'publish = "alerts/hot"\n')
    job, _ = load_job(str(cfg))
    assert broker_address(job) == ("127.0.0.1", 1884)
    assert job.history.rules_watermark == "2 minutes"
    assert [r.name for r in job.history.rules] == ["hot"]
