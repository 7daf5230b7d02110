"""sink.query checks what it can before any Spark starts (the SQL, the table path, whether the
history job is up), reads the query from an argument, -f FILE or stdin, waits for a job that is
still starting, and never starts a second Spark beside it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from sink.history.query import BadQuery, check_sql
from tests.conftest import ROOT, free_port


def test_one_read_only_statement():
    assert check_sql("  SELECT 1 ; ") == "SELECT 1"
    assert check_sql("with x as (select ';' as s) select * from x -- trailing ; comment") \
        .startswith("with x")
    assert check_sql("DESCRIBE messages") == "DESCRIBE messages"
    for bad, said in (("", "no SQL"), ("-- only a comment", "no SQL"),
                      ("SELECT 1; SELECT 2", "more than one statement"),
                      ("SELECT 'abc", "unclosed '"), ("SELECT (1", "unclosed '('"),
                      ("SELECT 1)", "unmatched ')'"), ("SELECT /* x", "unclosed /*"),
                      ("DROP TABLE messages", "only reads"), ("INSERT INTO messages VALUES (1)", "only reads")):
        with pytest.raises(BadQuery, match=re.escape(said)):
            check_sql(bad)


def query(args, tmp_path, stdin=None, timeout=60):
    # no Java: a Spark session started for any of these would fail loudly
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAVA_HOME": str(tmp_path / "no-java")}
    env.pop("SINK_CONNECT_URL", None)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "sink.query", "--data-dir", str(tmp_path / "data"),
                        "--connect", f"sc://127.0.0.1:{free_port()}", *args],
                       cwd=tmp_path, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
    return p, time.monotonic() - t0


def test_bad_sql_and_a_missing_table_are_said_before_spark_starts(tmp_path):
    p, _ = query(["DROP TABLE messages"], tmp_path)
    assert p.returncode == 2 and "only reads" in p.stderr and "Traceback" not in p.stderr
    p, _ = query(["--table", str(tmp_path / "nothing"), "SELECT count(*) FROM messages"], tmp_path)
    assert p.returncode == 2 and "no history table at" in p.stderr
    assert "local Spark session" not in p.stderr          # no Spark was started for it


def test_query_from_a_file_and_from_stdin(tmp_path):
    f = tmp_path / "q.sql"
    f.write_text("DELETE FROM messages\n")
    p, _ = query(["-f", str(f)], tmp_path)
    assert p.returncode == 2 and "'DELETE'" in p.stderr
    p, _ = query(["-f", "-"], tmp_path, stdin="UPDATE messages SET qos = 0")
    assert p.returncode == 2 and "'UPDATE'" in p.stderr
    p, _ = query([], tmp_path, stdin="TRUNCATE TABLE messages")
    assert p.returncode == 2 and "'TRUNCATE'" in p.stderr
    p, _ = query(["-f", str(tmp_path / "missing.sql")], tmp_path)
    assert p.returncode == 2 and "cannot read -f" in p.stderr


def test_a_job_that_is_starting_is_waited_for_then_said_not_up(tmp_path):
    """A job announced itself (running pid) but serves nothing yet: sink.query waits with a
    progress line, then says the job is not up instead of starting a second Spark."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "history_job.json").write_text(json.dumps(
        {"pid": os.getpid(), "started_at": time.time(), "table": str(tmp_path / "h"),
         "committed_file": str(tmp_path / "h_checkpoint" / "x.json")}))
    p, took = query(["--wait", "2", "SELECT count(*) FROM messages"], tmp_path)
    assert p.returncode == 2, p.stderr
    assert "waiting for the history job (pid" in p.stderr
    assert "does not serve Spark Connect" in p.stderr and "after 2 s" in p.stderr
    assert "local Spark session" not in p.stderr
