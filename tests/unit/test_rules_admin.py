"""Continuous rules on the broker's side (docs/rules.md): the rules' MQTT client ($rules) in the
broker's auth, the store changed through the admin service, the SQL check's plumbing and the
CLI's parser. Sans-I/O where the code allows (the core with tests/sansio.py)."""
from __future__ import annotations

import json
import logging
import os
import sys

import pytest

from broker.admin.__main__ import build_parser, table
from broker.admin.rules import RulesAdmin
from broker.admin.service import AdminError
from broker.auth import BAD_USER_NAME_OR_PASSWORD, AccessControl, from_config, hash_password
from broker.auth.rules import RulesAccount
from broker.core.broker import Broker
from broker.protocol import packets as P
from settings import AuthConfig, MQTTConfig
from settings import history_columns as col
from settings import rules as spec
from tests.sansio import Client, Clock, publish, recv, subscribe

RULES = spec.RULES_USER
PW = "the-rules-password"


def account(topics=("alerts/hot",)) -> RulesAccount:
    return RulesAccount(PW, topics)


# ------------------------------------------------------------------ AccessControl
def test_rules_user_logs_in_only_with_its_password_even_when_names_are_not_checked():
    """Anonymous allowed and no password file (names not verified): any other name is let in,
    but $rules only with the password of <data_dir>/secrets/rules.password (0x86 otherwise)."""
    ac = AccessControl(rules=account())
    assert ac.authenticate("job", RULES, PW.encode()) == 0
    assert ac.authenticate("job", RULES, b"guess") == BAD_USER_NAME_OR_PASSWORD
    assert ac.authenticate("job", RULES, None) == BAD_USER_NAME_OR_PASSWORD
    assert ac.authenticate_cached("job", RULES, b"guess") == BAD_USER_NAME_OR_PASSWORD
    assert ac.authenticate("dev", "anyone", None) == 0
    # without the account, nobody logs in under the reserved name
    assert AccessControl().authenticate("job", RULES, PW.encode()) == BAD_USER_NAME_OR_PASSWORD


def test_password_file_entry_for_the_rules_user_is_ignored_with_a_warning(tmp_path, caplog):
    pw = tmp_path / "passwd"
    pw.write_text(f"{RULES}:{hash_password('from-the-file', n=2 ** 4, r=1, p=1)}\n"
                  f"alice:{hash_password('a', n=2 ** 4, r=1, p=1)}\n")
    with caplog.at_level(logging.WARNING, logger="broker.auth"):
        ac = AccessControl(password_file=str(pw), rules=account())
    assert any(RULES in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)
    assert ac.authenticate("job", RULES, b"from-the-file") == BAD_USER_NAME_OR_PASSWORD
    assert ac.authenticate("job", RULES, PW.encode()) == 0
    assert ac.authenticate("a", "alice", b"a") == 0
    # the right password is answered without a hash: never deferred to the check threads
    assert ac.authenticate_cached("job", RULES, PW.encode()) == 0


def test_rules_user_publishes_only_to_its_rules_topics_and_subscribes_to_nothing(tmp_path):
    acl = tmp_path / "acl"
    acl.write_text(f"user {RULES}\ntopic readwrite #\npattern readwrite #\n")  # not used for it
    for ac in (AccessControl(rules=account()), AccessControl(acl_file=str(acl), rules=account())):
        assert ac.allow_publish("job", RULES, "alerts/hot")
        assert not ac.allow_publish("job", RULES, "alerts/cold")
        assert not ac.allow_subscribe("job", RULES, "alerts/hot")
        assert not ac.allow_subscribe("job", RULES, "#")
        assert not ac.allow_read("job", RULES, "alerts/hot")
    assert ac.acl is not None and ac.acl.can_write("job", RULES, "alerts/cold")  # what it said


def test_rules_user_is_not_held_to_the_client_id_pattern():
    ac = AccessControl(client_id_pattern="%u-*", rules=account())
    assert ac.check_client_id("rules-job", RULES) == 0
    assert ac.check_client_id("rules-job", "alice") != 0


def test_from_config_with_the_rules_account_checks_even_when_auth_is_off():
    assert from_config(AuthConfig()) is None
    ac = from_config(AuthConfig(), rules=account())
    assert ac is not None and ac.authenticate("j", RULES, b"x") == BAD_USER_NAME_OR_PASSWORD


def test_account_from_files_makes_the_password_and_reads_config_and_store_topics(tmp_path):
    d = str(tmp_path)
    cfg_rule = spec.check({"name": "hot", "sql": "SELECT 1", "publish": "alerts/hot"},
                          spec.CONFIG)
    spec.write_store(d, spec.Store([spec.check({"name": "cold", "sql": "SELECT 1",
                                                "publish": "alerts/cold"})]))
    a = RulesAccount.from_files(d, (cfg_rule,))
    password = open(os.path.join(d, "secrets", "rules.password")).read().strip()
    assert password and a.authenticate(password.encode()) == 0
    assert a.topics == {"alerts/hot", "alerts/cold"}
    assert oct(os.stat(os.path.join(d, "secrets", "rules.password")).st_mode & 0o777) == "0o600"


# ------------------------------------------------------------------ through the core
def broker_with(acct: RulesAccount) -> Broker:
    clock = Clock()
    return Broker(MQTTConfig(), clock=clock, wall=clock, auth=AccessControl(rules=acct))


def test_connect_as_rules_user_with_a_wrong_password_is_refused_0x86():
    """[MQTT-3.2.2-8] CONNACK 0x86 Bad User Name or Password, with anonymous clients allowed."""
    b = broker_with(account())
    c = Client(b)
    assert c.connect("rules-job", username=RULES, password=b"nope").reason_code == 0x86
    ok = Client(b)
    assert ok.connect("rules-job", username=RULES, password=PW.encode()).reason_code == 0
    assert Client(b).connect("dev", username="whoever").reason_code == 0


def test_rules_client_publish_outside_its_topics_is_refused_and_subscribe_too():
    """PUBACK 0x87 Not authorized outside the rules' topics [MQTT-3.3.4-1]; SUBACK 0x87."""
    b = broker_with(account())
    c = Client(b)
    assert c.connect("rules-job", username=RULES, password=PW.encode()).reason_code == 0
    publish(c, "alerts/cold", b"{}", qos=1, pid=1)
    ack = recv(c)
    assert ack.type == P.PUBACK and ack.reason_code == 0x87
    publish(c, "alerts/hot", b"{}", qos=1, pid=2)
    ack = recv(c)
    assert ack.type == P.PUBACK and ack.reason_code in (0, 0x10)
    assert subscribe(c, "alerts/hot", qos=1, pid=3).reason_codes == [0x87]


class CountingAccess(AccessControl):
    """AccessControl counting the PUBLISHes it is asked about."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.asked: list[str] = []

    def allow_publish(self, client_id, username, topic):
        self.asked.append(topic)
        return super().allow_publish(client_id, username, topic)


def test_without_an_acl_only_the_rules_clients_publishes_are_checked():
    """The rules' account alone puts AccessControl on a broker: an ordinary client's PUBLISHes
    are not asked about (there is nothing to refuse them), the rules client's are
    [MQTT-3.3.4-1]."""
    clock = Clock()
    auth = CountingAccess(rules=account())
    b = Broker(MQTTConfig(), clock=clock, wall=clock, auth=auth)
    dev, job = Client(b), Client(b)
    assert dev.connect("dev").reason_code == 0
    assert job.connect("rules-job", username=RULES, password=PW.encode()).reason_code == 0
    publish(dev, "plant/t1", b"{}", qos=1, pid=1)
    assert recv(dev).reason_code in (0, 0x10)
    publish(job, "alerts/cold", b"{}", qos=1, pid=1)
    assert recv(job).reason_code == 0x87
    assert auth.asked == ["alerts/cold"]


def test_with_an_acl_file_every_publish_is_checked(tmp_path):
    """An ACL file (reloaded while the broker runs) makes every client's PUBLISH a check."""
    acl = tmp_path / "acl"
    acl.write_text("topic write plant/#\n")
    clock = Clock()
    auth = CountingAccess(rules=account(), acl_file=str(acl))
    b = Broker(MQTTConfig(), clock=clock, wall=clock, auth=auth)
    dev = Client(b)
    assert dev.connect("dev").reason_code == 0
    publish(dev, "plant/t1", b"{}", qos=1, pid=1)
    assert recv(dev).reason_code in (0, 0x10)
    publish(dev, "office/t1", b"{}", qos=1, pid=2)
    assert recv(dev).reason_code == 0x87
    assert auth.asked == ["plant/t1", "office/t1"]


# ------------------------------------------------------------------ the admin service
def admin(tmp_path, config=(), clock=lambda: 1000.0):
    acct = account(())
    acct.data_dir = str(tmp_path)
    acct.config_rules = tuple(config)
    return RulesAdmin(str(tmp_path), config, acct, clock=clock), acct


CONFIG_RULE = spec.check({"name": "hot", "sql": "SELECT topic FROM messages",
                          "publish": "alerts/hot"}, spec.CONFIG)


def add(ra, name, sql="SELECT topic FROM messages", **kw):
    return ra.add(ra.prepare({"name": name, "sql": sql, **kw}))


def test_add_stores_the_rule_and_lets_the_rules_client_publish_to_its_topic(tmp_path):
    ra, acct = admin(tmp_path, [CONFIG_RULE])
    acct.refresh()
    assert acct.topics == {"alerts/hot"}
    add(ra, "cold", publish="alerts/cold", table="cold_rows")
    doc = json.load(open(spec.store_path(str(tmp_path))))
    assert doc["rules"] == [{"name": "cold", "sql": "SELECT topic FROM messages",
                             "publish": "alerts/cold", "table": "cold_rows"}]
    assert acct.topics == {"alerts/hot", "alerts/cold"}
    assert ra.remove("cold") and acct.topics == {"alerts/hot"}


@pytest.mark.parametrize("body,wanted", [
    ({"name": "hot", "sql": "SELECT 1", "publish": "x"}, "defined in the config file"),
    ({"name": "n", "sql": "DROP TABLE messages", "publish": "x"}, "must be a query"),
    ({"name": "n", "sql": "SELECT 1"}, "give publish"),
    ({"name": "n", "sql": "SELECT 1", "publish": "a/#"}, "no wildcards"),
    ({"name": "1n", "sql": "SELECT 1", "publish": "x"}, "rule name"),
])
def test_add_refuses_what_cannot_be_a_rule_saying_why(tmp_path, body, wanted):
    ra, _ = admin(tmp_path, [CONFIG_RULE])
    with pytest.raises(AdminError, match=wanted):
        ra.prepare(body)
    assert not os.path.exists(spec.store_path(str(tmp_path)))


def test_add_refuses_a_name_in_use_and_more_than_max_rules(tmp_path, monkeypatch):
    ra, _ = admin(tmp_path)
    add(ra, "a", publish="t/a")
    with pytest.raises(AdminError, match="exists already"):
        ra.prepare({"name": "a", "sql": "SELECT 1", "publish": "t/b"})
    monkeypatch.setattr(spec, "MAX_RULES", 2)
    add(ra, "b", publish="t/b")
    with pytest.raises(AdminError, match="at most 2"):
        ra.prepare({"name": "c", "sql": "SELECT 1", "publish": "t/c"})


def test_a_config_rule_is_paused_and_resumed_but_not_removed(tmp_path):
    ra, _ = admin(tmp_path, [CONFIG_RULE])
    with pytest.raises(AdminError, match="defined in the config file: remove it there.*pause"):
        ra.remove("hot")
    assert ra.pause("hot")
    assert [r["paused"] for r in ra.list()["rules"]] == [True]
    assert ra.pause("hot", False)
    assert [r["paused"] for r in ra.list()["rules"]] == [False]
    assert not ra.pause("nosuch") and not ra.remove("nosuch")


def test_list_merges_the_jobs_status_and_says_how_old_it_is(tmp_path):
    ra, _ = admin(tmp_path, [CONFIG_RULE], clock=lambda: 2000.0)
    add(ra, "cold", publish="alerts/cold")
    r = ra.list()
    assert [x["state"] for x in r["rules"]] == ["not started", "not started"]
    assert r["status_stale"] and r["status_age_seconds"] is None
    spec.write_status(str(tmp_path), {"hot": {"state": "running", "rows": 12,
                                              "rows_per_second": 0.5, "last_error": ""},
                                      "cold": {"state": "failed", "rows": 0,
                                               "last_error": "AnalysisException: boom"}})
    written = spec.read_status(str(tmp_path))["written_at"]
    ra.clock = lambda: written + 5
    r = ra.list()
    by = {x["name"]: x for x in r["rules"]}
    assert by["hot"]["state"] == "running" and by["hot"]["rows"] == 12
    assert by["hot"]["rows_per_second"] == 0.5 and by["hot"]["source"] == "config"
    assert by["cold"]["state"] == "failed" and by["cold"]["last_error"] == "AnalysisException: boom"
    assert r["status_age_seconds"] == 5 and not r["status_stale"]
    ra.pause("hot")   # until the job says so: pausing
    assert {x["name"]: x["state"] for x in ra.list()["rules"]}["hot"] == "pausing"
    spec.write_status(str(tmp_path), {"hot": {"state": "paused", "rows": 12}})
    ra.pause("hot", False)
    assert {x["name"]: x["state"] for x in ra.list()["rules"]}["hot"] == "resuming"


def test_a_store_that_is_not_a_store_refuses_changes_naming_the_file(tmp_path):
    ra, _ = admin(tmp_path)
    os.makedirs(spec.rules_dir(str(tmp_path)))
    open(spec.store_path(str(tmp_path)), "w").write("{not json")
    with pytest.raises(AdminError, match="rules.json"):
        ra.prepare({"name": "n", "sql": "SELECT 1", "publish": "x"})


def test_history_columns_types_are_the_tables():
    """The empty `messages` a rule's SQL is checked against has the table's columns and types."""
    pytest.importorskip("pyspark")
    from sink.history.schema import HISTORY_SCHEMA
    assert [(c, t.lower().replace(" ", "")) for c, t in col.COLUMN_TYPES] == \
        [(f.name, f.dataType.simpleString()) for f in HISTORY_SCHEMA.fields]


# ------------------------------------------------------------------ the SQL check's plumbing
class FakeSpark:
    """What check_sql uses of a SparkSession; `refuse` makes the analysis fail."""

    def __init__(self, refuse=None):
        self.refuse, self.sql_seen = refuse, []

    def sql(self, text):
        self.sql_seen.append(text)
        spark = self

        class DF:
            @property
            def schema(self):
                if spark.refuse:
                    raise Exception(spark.refuse)

                class F:
                    name, dataType = "topic", type("T", (), {"simpleString": lambda s: "string"})()
                return type("S", (), {"fields": [F()]})()
        return DF()


def test_check_sql_analyses_one_query_over_an_empty_messages():
    """One query (the job's Spark Connect sessions run no command): the rule's SQL as a
    subquery under WITH messages AS (an empty relation with the table's columns)."""
    from broker.dashboard.history_worker import EMPTY_MESSAGES, SQLRefused, check_sql
    s = FakeSpark()
    assert check_sql(s, "SELECT topic FROM messages") == {"columns": [["topic", "string"]]}
    assert s.sql_seen == [f"WITH messages AS ({EMPTY_MESSAGES}) SELECT * FROM (\n"
                          f"SELECT topic FROM messages\n) AS rule"]
    assert "CAST(NULL AS VARIANT) AS payload_json" in EMPTY_MESSAGES
    s = FakeSpark(refuse="[UNRESOLVED_COLUMN] nope")
    with pytest.raises(SQLRefused, match="UNRESOLVED_COLUMN"):
        check_sql(s, "SELECT nope FROM messages")


async def test_check_sql_without_the_job_says_it_must_run_and_how():
    import socket

    from broker.dashboard.history import HistoryClient, JobNotRunning
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]    # nothing listens there
    h = HistoryClient(f"sc://127.0.0.1:{port}", 5, "python -m sink.job --config F")
    with pytest.raises(JobNotRunning, match="must run to check.*python -m sink.job --config F"):
        await h.check_sql("SELECT 1")


async def test_check_sql_returns_sparks_refusal_as_bad_request(tmp_path):
    import socket

    from broker.dashboard.history import BadRequest, HistoryClient
    fake = ("import json, sys\nfor line in sys.stdin:\n    q = json.loads(line)\n"
            "    print(json.dumps({'error': 'sql', 'detail': 'UNRESOLVED_COLUMN ' + q['check_sql']})"
            " if 'nope' in q['check_sql'] else json.dumps({'answer': {'columns': [['a', 'int']]}}),"
            " flush=True)\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(5)
        h = HistoryClient(f"sc://127.0.0.1:{sock.getsockname()[1]}", 5, "python -m sink.job")
        h.command = [sys.executable, "-c", fake]
        try:
            assert await h.check_sql("SELECT a FROM messages") == [["a", "int"]]
            with pytest.raises(BadRequest, match="Spark refused the rule's SQL: UNRESOLVED_COLUMN"):
                await h.check_sql("SELECT nope FROM messages")
        finally:
            await h.close()


# ------------------------------------------------------------------ the CLI
def test_cli_parses_every_rules_operation():
    p = build_parser()
    a = p.parse_args(["rules", "add", "hot", "--sql", "SELECT topic FROM messages",
                      "--publish", "alerts/hot", "--table", "hot_rows"])
    assert (a.command, a.op, a.name, a.publish, a.table) == \
        ("rules", "add", "hot", "alerts/hot", "hot_rows")
    for op in ("pause", "resume", "remove"):
        assert p.parse_args(["rules", op, "hot"]).op == op
    assert p.parse_args(["--json", "rules", "list"]).json
    assert table([], ("name",)) == "(none)"


def test_sparks_error_is_shown_without_its_plan_and_with_the_rules_line_numbers():
    from broker.dashboard.history_worker import spark_message
    analysis = ("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column `nope` cannot be resolved. SQLSTATE: "
                "42703; line 2 pos 7;\n'Project [*]\n+- 'SubqueryAlias rule\n")
    assert spark_message(analysis) == ("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column `nope` "
                                       "cannot be resolved. SQLSTATE: 42703 (line 1 pos 7")
    syntax = ("[PARSE_SYNTAX_ERROR] Syntax error at or near 'messages'. SQLSTATE: 42601 (line 2, "
              "pos 11)\n\n== SQL ==\nSELECT * FROM (\nDROP TABLE messages\n-----------^^^\n) AS rule\n")
    assert spark_message(syntax) == ("[PARSE_SYNTAX_ERROR] Syntax error at or near 'messages'. "
                                     "SQLSTATE: 42601 (line 1, pos 11)\nDROP TABLE messages\n"
                                     "-----------^^^")


def test_history_rules_are_read_by_the_broker_too():
    """A broker started alone reads [[history.rules]] (its rules' client may publish to their
    topics), so giving them to it is not refused as a setting nobody reads."""
    from settings import Config, parts
    assert parts.readers("history", "rules") == {parts.JOB, parts.BROKER}
    parts.check_used(Config(), [("history", "rules", "--config")], ["broker"], "python -m broker")


def test_a_broker_with_no_job_and_no_rules_makes_no_password_but_reads_the_jobs(tmp_path):
    """No sink (so no job) and no rules: nothing is read or made at start; a password the job
    made later logs in, a wrong one still gets 0x86."""
    d = str(tmp_path)
    a = RulesAccount.from_files(d, (), job_may_run=False)
    assert not os.path.exists(os.path.join(d, "secrets")) and a.topics == frozenset()
    assert a.authenticate(b"anything") == BAD_USER_NAME_OR_PASSWORD
    made = spec.password(d, create=True)   # the job, starting later
    assert a.authenticate(b"anything") == BAD_USER_NAME_OR_PASSWORD
    assert a.authenticate(made.encode()) == 0
