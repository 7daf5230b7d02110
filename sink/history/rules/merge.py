"""One pass over a batch for every simple stateless rule (sink/history/rules/shared.py).

A rule that is only ``SELECT <columns> FROM messages [WHERE <condition>]`` becomes one
``CASE WHEN`` arm: its condition chooses the rows, its columns make the row's JSON object. The
arms of all such rules are one projection over the batch, exploded, so Spark reads the batch
once and plans one small query, where the union of the rules' subqueries (shared.union_sql)
read the batch once per rule and planned each: over a batch of 25,000 readings, five rules
cost the JVM 281-292 ms of CPU that way against 132-159 ms as one pass, once the JIT settled
(bench/rules_pass.py; docs/rules.md "Figures").

Nothing is rewritten by guesswork. Spark's own parser finds the columns and the condition, and
each is taken from the rule's text as written (their positions in the text), each on lines of
its own. Then the rule as rebuilt must have the same optimised plan as the rule itself
(``sameResult``: same reads, same expressions, same filter) over the same batch; a rule that
does not (or that reads anything but ``messages``, or ``*``, or a subquery) keeps its subquery in
the union, which gives the same rows, only at the old cost.
"""
from __future__ import annotations

import logging
import re
from typing import Any

from settings.rules import RuleSpec, client_id

log = logging.getLogger(__name__)

#: expression classes (parts of their names) that make a rule read more than its row, or all
#: its columns: such a rule keeps its subquery
_NOT_ROW_LOCAL = ("Subquery", "Exists", "ListQuery", "Star", "Lateral", "Outer")


def sql_string(text: str) -> str:
    """A SQL string literal of the text."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _row_local(expr: Any) -> bool:
    """No subquery, star or outer reference anywhere in the (parsed) expression."""
    name = expr.getClass().getSimpleName()
    if any(k in name for k in _NOT_ROW_LOCAL):
        return False
    children = expr.children().iterator()
    while children.hasNext():
        if not _row_local(children.next()):
            return False
    return True


#: a rule's start up to its first column, and what comes between two columns
_GAP = r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*"
_SELECT = re.compile(_GAP + r"SELECT\b", re.I | re.S)
_COMMA = re.compile(_GAP + ",", re.S)
#: what may come between ``messages`` and its condition: blanks, comments, WHERE
_BEFORE_CONDITION = re.compile(_GAP + r"WHERE\b", re.I | re.S)


def parts(session: Any, sql: str) -> tuple[list[tuple[str, bool]], str | None] | None:
    """When the rule is ``SELECT <columns> FROM messages [WHERE <condition>]``: its columns as
    written, each with whether it has an alias (its text then is "expression AS name"), and its
    condition (None without WHERE), as texts; else None."""
    plan = session._jsparkSession.sessionState().sqlParser().parsePlan(sql)
    if plan.getClass().getSimpleName() != "Project":
        return None
    child = plan.child()
    condition = None
    if child.getClass().getSimpleName() == "Filter":
        condition = child.condition()
        child = child.child()
    if (child.getClass().getSimpleName() != "UnresolvedRelation"
            or child.multipartIdentifier().mkString(".").lower() != "messages"):
        return None
    columns: list[tuple[str, bool]] = []
    begin = _SELECT.match(sql)
    if begin is None:
        return None
    at = begin.end()   # where the next column's text starts (after SELECT, then a comma)
    items = plan.projectList().iterator()
    while items.hasNext():
        item = items.next()
        kind = item.getClass().getSimpleName()
        # a column's text runs from the end of the one before to its own end: where the parser
        # says an expression starts is not always its start (an IN's starts at IN)
        stop = (item.child() if kind == "UnresolvedAlias" else item).origin().stopIndex()
        if not stop.isDefined() or not _row_local(item):
            return None
        sep = _COMMA.match(sql, at) if columns else None
        text = sql[sep.end() if sep else at:stop.get() + 1]
        at = stop.get() + 1
        columns.append((text, kind == "Alias"))
    if condition is not None and not _row_local(condition):
        return None
    cond = None
    if condition is not None:   # the rest of the rule after WHERE (nothing else can follow)
        stop = child.origin().stopIndex()
        if not stop.isDefined():
            return None
        m = _BEFORE_CONDITION.match(sql, stop.get() + 1)
        if m is None:
            return None
        cond = sql[m.end():]
    return columns, cond


def _items(columns: list[tuple[str, bool]], names: list[str]) -> str:
    """Select items (or struct fields): the aliased columns as written, the others named as
    Spark names them in the rule."""
    return ", ".join(f"\n{c}\n" if aliased else f"(\n{c}\n) AS `{n.replace('`', '``')}`"
                     for (c, aliased), n in zip(columns, names))


def _rebuilt(items: str, cond: str | None, messages: str) -> str:
    """The rule as its parts say, for the comparison with the rule itself."""
    where = f"\nWHERE (\n{cond}\n)" if cond is not None else ""
    return f"{messages}\nSELECT {items} FROM messages{where}"


def arm(session: Any, spec: RuleSpec, rule_sql: str, messages: str, row_json: str,
        view: str) -> str | None:
    """The rule's ``CASE WHEN`` arm for merged_sql, or None when it cannot be one. ``rule_sql``
    is the rule over the batch (shared.rule_sql) and ``messages`` the CTE in it that shows the
    batch ``view`` to the rule as ``messages``, without its own messages; ``row_json`` is
    to_json's options as SQL. Asks Spark to parse and plan the rule a few times: once per rule
    (the rules thread keeps the answer)."""
    try:
        got = parts(session, spec.sql.strip().rstrip(";").rstrip())
        if got is None:
            return None
        columns, cond = got
        own = session.sql(rule_sql)
        names = list(own.columns)
        if len(names) != len(columns):
            return None
        items = _items(columns, names)
        rebuilt = session.sql(_rebuilt(items, cond, messages))
        if not own._jdf.queryExecution().optimizedPlan().sameResult(
                rebuilt._jdf.queryExecution().optimizedPlan()):
            log.info("rule %s keeps a query of its own in each batch: as one pass it would not "
                     "be the same query", spec.name)
            return None
        keep = f"client_id IS DISTINCT FROM {sql_string(client_id(spec.name))}"
        when = f"{keep} AND (\n{cond}\n)" if cond is not None else keep
        out = (f"CASE WHEN {when}\nTHEN named_struct('rule', {sql_string(spec.name)}, 'row', "
               f"to_json(struct({items}), {row_json})) END")
        session.sql(merged_sql([out], view))   # analyses in the pass (a generator would not)
        return out
    except Exception as exc:   # no py4j session (Spark Connect), or the rule does not analyse
        log.debug("rule %s: not merged: %s", spec.name, exc)
        return None


def merged_sql(arms: list[str], view: str) -> str:
    """Every merged rule's rows as (rule, row) in one pass over ``view``: each arm gives its
    rule's row or NULL, for every row of the batch."""
    return (f"SELECT rule, row FROM (WITH messages AS (SELECT * FROM {view})\n"
            "SELECT m.rule AS rule, m.row AS row FROM (SELECT explode(array(\n"
            + ",\n".join(arms) + "\n)) AS m FROM messages) WHERE m IS NOT NULL)")
