"""The real command lines with a bad setting: exit status 2 and one stderr line naming the key,
never a traceback and never a broker that starts anyway (README "Configuration and
precedence": a bad setting stops the command with exit status 2 and one line)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.timeout(300)


def run(module: str, args: list, tmp_path, env: dict | None = None):
    try:
        return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=90, stdin=subprocess.DEVNULL, check=False,
                              env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"python -m {module} {' '.join(args)} did not stop on a bad setting "
                    "(it started anyway)")


def broker_args(tmp_path, *args) -> list:
    return ["--host", "127.0.0.1", "--port", str(free_port()), "--data-dir", str(tmp_path), *args]


def assert_config_error(p, *wanted: str) -> None:
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("config error: "), lines[0]
    for text in wanted:
        assert text in lines[0], f"{text!r} not in {lines[0]!r}"
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stdout == ""


BROKER_CASES = [
    (["--set", "sink.durability=bogus"], ["sink.durability = 'bogus'", "'spool', 'async', 'none'"]),
    (["--sink", "--set", "sink.durability=bogus"], ["sink.durability", "'spool', 'async', 'none'"]),
    (["--set", "sink.spool_max_bytes=1GB"], ["sink.spool_max_bytes = '1GB'", "whole number"]),
    (["--set", "persistence.synchronous=sometimes"], ["persistence.synchronous", "'NORMAL'"]),
    (["--set", "mqtt.maximum_qos=3"], ["mqtt.maximum_qos", "from 0 to 2"]),
    (["--set", "mqtt.recieve_maximum=3"], ["did you mean mqtt.receive_maximum?"]),
    (["--set", "metrics.enabled=true", "--set", "metrics.port=http"], ["metrics.port"]),
    (["--set", "broker.log_level=LOUD"], ["broker.log_level", "'DEBUG'"]),
    (["--log-level", "LOUD"], ["broker.log_level", "(--log-level)"]),
    (["--set", "sink.durability"], ["--set", "SECTION.KEY=VALUE"]),
    (["--set", "sinks.topic=x"], ["unknown section", "did you mean sink?"]),
    (["--config", "/nonexistent/broker.toml"], ["/nonexistent/broker.toml", "does not exist"]),
    (["--kafka-bootstrap", "kafka"], ["sink.bootstrap_servers", "HOST:PORT"]),
    (["--set", "auth.allow_anonymous=false"], ["auth.allow_anonymous", "auth.password_file"]),
    (["--set", "auth.password_file=/nonexistent/passwd"],
     ["auth.password_file = '/nonexistent/passwd'", "not found"]),
    (["--set", "dashboard.enabled=true", "--set", "dashboard.connect_url=http://x"],
     ["dashboard.connect_url", "sc://HOST:PORT"]),
]


@pytest.mark.parametrize("args,wanted", BROKER_CASES, ids=[" ".join(c[0]) for c in BROKER_CASES])
def test_broker_bad_setting(tmp_path, args, wanted):
    assert_config_error(run("broker", broker_args(tmp_path, *args), tmp_path), *wanted)


def test_broker_port_out_of_range(tmp_path):
    p = run("broker", ["--port", "70000", "--data-dir", str(tmp_path)], tmp_path)
    assert_config_error(p, "broker.port = 70000 (--port)", "from 0 to 65535")


FILES = [
    ("[mqtt]\nreceive_maximum = \n", ["not valid TOML", "line 2"]),
    ("[sink]\ndurability = \"bogus\"\n", ["sink.durability = 'bogus' (bad.toml)"]),
    ("[sinks]\ntopic = \"x\"\n", ["[sinks]", "unknown section"]),
    ("[[listeners]]\ntype = \"tls\"\nport = 1\n", ["listeners[0].certfile", "needs certfile"]),
    ("[[listeners]]\ntype = \"tls\"\nport = 1\ncertfile = \"/nonexistent.pem\"\n",
     ["listeners[0].certfile = '/nonexistent.pem'", "No such file"]),
    ("[[listeners]]\ntype = \"quic\"\nport = 1\n", ["listeners[0].type", "'tcp', 'tls', 'ws', 'wss'"]),
]


@pytest.mark.parametrize("text,wanted", FILES, ids=[c[1][0] for c in FILES])
def test_broker_bad_file(tmp_path, text, wanted):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    assert_config_error(run("broker", broker_args(tmp_path, "--config", str(f)), tmp_path), *wanted)


def test_broker_bad_environment(tmp_path):
    p = run("broker", broker_args(tmp_path), tmp_path, env={"MQTT_BROKER_SINK__DURABILITY": "x"})
    assert_config_error(p, "sink.durability = 'x' (MQTT_BROKER_SINK__DURABILITY)")


def test_check_config(tmp_path):
    """--check-config (scripts/run.sh runs it first): 0 for the shipped files, else the one line."""
    empty = tmp_path / "passwd"  # deploy/broker.toml's password file, empty in the image
    empty.write_text("")
    for name, more in (("config/broker.toml", []),
                       ("deploy/broker.toml", ["--set", f"auth.password_file={empty}"])):
        p = run("broker", ["--config", str(ROOT / name), "--check-config", *more], tmp_path)
        assert (p.returncode, p.stderr, p.stdout) == (0, "", "")
    p = run("broker", ["--config", str(ROOT / "config/broker.toml"), "--set",
                       "sink.keep_until=always", "--check-config"], tmp_path)
    assert_config_error(p, "sink.keep_until = 'always'", "'kafka', 'history'")


def test_job_bad_config(tmp_path):
    """python -m sink.job reads the same file through the same loader."""
    f = tmp_path / "bad.toml"
    for text, wanted in (("[history]\nsource = \"spark\"\n", "history.source = 'spark'"),
                         ("[sink]\ndurability = \"bogus\"\n", "sink.durability"),
                         ("[history]\ntrigger_seconds = 0\n", "history.trigger_seconds = 0"),
                         ("[sink]\nembedded_port = 0\n", "sink.embedded_port = 0"),
                         ("[history\n", "not valid TOML")):
        f.write_text(text)
        assert_config_error(run("sink.job", ["--config", str(f), "--available-now"], tmp_path),
                            wanted)
    assert_config_error(run("sink.job", ["--config", str(tmp_path / "none.toml")], tmp_path),
                        "does not exist")


def test_job_bad_flags_one_line(tmp_path):
    """The job's own flag values: exit 2, one line, no traceback."""
    for args in (["--log-level", "LOUD"], ["--trigger-seconds", "0"], ["--kafka-bootstrap", "k"],
                 ["--connect-port", "70000"]):
        p = run("sink.job", args, tmp_path)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert len(p.stderr.splitlines()) == 1, p.stderr


def test_query_bad_connect_url_env(tmp_path):
    p = run("sink.query", ["SELECT 1"], tmp_path, env={"SINK_CONNECT_URL": "http://x:1"})
    assert_config_error(p, "SINK_CONNECT_URL = 'http://x:1'", "sc://HOST:PORT")


def test_unusable_data_dir_is_one_line(tmp_path):
    """Not a setting's value but what it points at: exit 1 with one log line, no traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    p = run("broker", ["--host", "127.0.0.1", "--port", str(free_port()),
                       "--data-dir", str(blocker / "data")], tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    errors = [line for line in p.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "cannot start" in errors[0] and str(blocker) in errors[0], p.stderr
