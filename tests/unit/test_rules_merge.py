"""The one pass of a batch's simple rules (sink/history/rules/merge.py), the parts that need no
Spark: how a column, the gaps between columns and the start of the condition are found in the
rule's text, how columns are named, and the statement's shape. Spark's side (parsing, the
plan comparison, the rows) is tests/e2e/test_rules_job.py's."""
from __future__ import annotations

from sink.history.rules import merge


def test_the_first_column_starts_after_select_and_its_comments():
    sql = "  -- the alert\n/* hot */ select topic, qos FROM messages"
    m = merge._SELECT.match(sql)
    assert m is not None and sql[m.end():].startswith(" topic")


def test_a_comma_between_columns_is_found_past_comments_and_line_ends():
    sql = "topic -- the topic\n, qos"
    m = merge._COMMA.match(sql, len("topic"))
    assert m is not None and sql[m.end():] == " qos"
    assert merge._COMMA.match("topic AS t, qos", len("topic")) is None   # not the column's end


def test_the_condition_is_what_follows_where_comments_kept_out():
    sql = "SELECT topic FROM messages -- readings\n /* all */ WHERE qos = 1 -- high\n"
    m = merge._BEFORE_CONDITION.match(sql, sql.index("messages") + len("messages"))
    assert m is not None and sql[m.end():] == " qos = 1 -- high\n"
    assert merge._BEFORE_CONDITION.match("messages m WHERE m.qos = 1", len("messages")) is None


def test_unaliased_columns_take_sparks_names_and_aliased_ones_stay_as_written():
    items = merge._items([("topic", False), ("payload_json:temp::int AS t", True),
                          ("qos IN (0, 1)", False)], ["topic", "t", "weird`name"])
    assert items == ("(\ntopic\n) AS `topic`, \npayload_json:temp::int AS t\n, "
                     "(\nqos IN (0, 1)\n) AS `weird``name`")


def test_every_arm_is_one_element_of_one_exploded_array_over_the_batch():
    sql = merge.merged_sql(["CASE WHEN a THEN x END", "CASE WHEN b THEN y END"], "_rules_batch")
    assert sql == ("SELECT rule, row FROM (WITH messages AS (SELECT * FROM _rules_batch)\n"
                   "SELECT m.rule AS rule, m.row AS row FROM (SELECT explode(array(\n"
                   "CASE WHEN a THEN x END,\nCASE WHEN b THEN y END\n)) AS m FROM messages) "
                   "WHERE m IS NOT NULL)")


def test_a_rule_name_or_client_id_is_a_quoted_sql_string():
    assert merge.sql_string("it's a\\b") == "'it\\'s a\\\\b'"


def test_a_session_without_sparks_parser_merges_nothing():
    from settings.rules import RuleSpec

    class ConnectSession:   # Spark Connect's session has no py4j parser
        pass
    assert merge.arm(ConnectSession(), RuleSpec("r", "SELECT topic FROM messages"), "", "", "", "v") is None
