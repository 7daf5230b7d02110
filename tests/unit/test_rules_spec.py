"""Continuous rules' definitions (settings/rules.py): checked shapes, the store, the merge of
config and store, and the status file the job writes."""
from __future__ import annotations

import os
import stat

import pytest

from settings import rules
from settings.checks import ConfigError
from settings.load import load


def test_a_config_rule_is_read_from_history_rules_tables(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[[history.rules]]\nname = "hot"\nsql = "SELECT topic FROM messages"\n'
                 'publish = "alerts/hot"\n\n[[history.rules]]\nname = "agg"\n'
                 'sql = "SELECT count(*) AS n FROM messages"\ntable = "agg_t"\n')
    got = load(str(f), env={}).history.rules
    assert [(r.name, r.publish, r.table, r.source) for r in got] == [
        ("hot", "alerts/hot", "", "config"), ("agg", "", "agg_t", "config")]


@pytest.mark.parametrize("rule, words", [
    ({"name": "1x", "sql": "SELECT 1", "publish": "a"}, "rule name"),
    ({"name": "x", "sql": " ", "publish": "a"}, "sql is missing"),
    ({"name": "x", "sql": "SELECT 1"}, "publish (an MQTT topic) and/or table"),
    ({"name": "x", "sql": "SELECT 1", "publish": "alerts/#"}, "no wildcards"),
    ({"name": "x", "sql": "SELECT 1", "publish": "$SYS/x"}, "not starting with $"),
    ({"name": "x", "sql": "SELECT 1", "table": "1bad"}, "table '1bad'"),
    ({"name": "x", "sql": "SELECT 1", "table": "t", "when": 1}, "unknown rule keys"),
    ({"name": "x", "sql": "S" * (rules.MAX_SQL + 1), "table": "t"}, "at most"),
])
def test_a_malformed_rule_is_refused_saying_what_to_change(rule, words):
    with pytest.raises(rules.RuleError, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("$", r"\$")):
        rules.check(rule)


def test_two_config_rules_with_one_name_are_refused(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[[history.rules]]\nname = "a"\nsql = "SELECT 1"\ntable = "t"\n'
                 '[[history.rules]]\nname = "a"\nsql = "SELECT 2"\ntable = "u"\n')
    with pytest.raises(ConfigError, match="given more than once"):
        load(str(f), env={})


def test_the_store_round_trips_and_is_written_whole(tmp_path):
    d = str(tmp_path)
    assert rules.read_store(d) == rules.Store()
    s = rules.Store([rules.check({"name": "r1", "sql": "SELECT topic FROM messages",
                                  "publish": "out/r1"})], {"r1", "cfg"})
    rules.write_store(d, s)
    assert rules.read_store(d) == s
    assert os.listdir(rules.rules_dir(d)) == [rules.STORE_FILE]  # no temporary left


def test_a_store_that_is_not_one_is_refused_naming_the_file(tmp_path):
    os.makedirs(rules.rules_dir(str(tmp_path)))
    with open(rules.store_path(str(tmp_path)), "w") as f:
        f.write('{"rules": [{"name": "x"}]}')
    with pytest.raises(rules.RuleError, match="rules.json: rule x: sql is missing"):
        rules.read_store(str(tmp_path))


def test_config_rules_come_first_and_the_store_pauses_either_kind():
    cfg = (rules.check({"name": "a", "sql": "SELECT 1", "table": "t"}, rules.CONFIG),)
    store = rules.Store([rules.check({"name": "b", "sql": "SELECT 2", "publish": "o/b"}),
                         rules.check({"name": "a", "sql": "SELECT 3", "publish": "o/a"})], {"a"})
    got = rules.effective(cfg, store)
    assert [(r.name, r.sql, r.paused, r.source) for r in got] == [
        ("a", "SELECT 1", True, "config"), ("b", "SELECT 2", False, "store")]
    assert rules.publish_topics(got) == {"o/b"}


def test_the_rules_password_is_a_private_secret_made_once(tmp_path):
    p1 = rules.password(str(tmp_path))
    assert p1 and len(p1) >= 32 and rules.password(str(tmp_path), create=False) == p1
    path = os.path.join(str(tmp_path), "secrets", rules.PASSWORD_FILE)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_the_status_file_reads_back_and_is_empty_before_the_job_writes(tmp_path):
    assert rules.read_status(str(tmp_path)) == {"written_at": None, "rules": {}}
    rules.write_status(str(tmp_path), {"hot": {"state": "running", "rows": 3}})
    got = rules.read_status(str(tmp_path))
    assert got["rules"] == {"hot": {"state": "running", "rows": 3}} and got["written_at"] > 0
