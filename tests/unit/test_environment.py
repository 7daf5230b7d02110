"""Every environment variable the project reads is declared once (settings/environment.py), listed
by the --help of the commands that read it, and in docs/configuration.md; what reads it keeps its meaning."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from settings import environment
from settings.environment import ALL, BY_NAME, COMPOSE, SETTINGS_PREFIX

ROOT = Path(__file__).resolve().parents[2]
CODE = [p for pkg in ("broker", "cluster", "kafka_client", "mqtt_topics", "settings", "sink")
        for p in sorted((ROOT / pkg).rglob("*.py"))] + [ROOT / "deploy/healthcheck.py"]


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
        (isinstance(node, ast.Name) and node.id == "environ")


def names_read(path: Path) -> tuple[set[str], list[str]]:
    """The variable names a file reads (os.environ.get / [] / os.getenv, by a literal or a module
    constant), and the reads whose name it cannot tell."""
    tree = ast.parse(path.read_text(), str(path))
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
              for t in n.targets if isinstance(t, ast.Name)}
    found, unknown = set(), []
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr == "get" and _is_environ(f.value)) or f.attr == "getenv":
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and _is_environ(node.value):
            arg = node.slice
        if arg is None:
            continue
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.add(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in consts:
            found.add(consts[arg.id])
        else:
            unknown.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found, unknown


def declared(name: str) -> bool:
    return name in BY_NAME or name.startswith(SETTINGS_PREFIX)


def test_every_variable_the_code_reads_is_declared():
    undeclared, unknown = [], []
    for path in CODE:
        if path.name == "environment.py" and path.parent.name == "settings":
            continue
        found, blind = names_read(path)
        undeclared += [f"{path.relative_to(ROOT)}: {n}" for n in sorted(found) if not declared(n)]
        unknown += blind
    assert not undeclared, ("read but not declared in settings/environment.py (add an EnvVar "
                            f"there and read it with .get()): {undeclared}")
    assert not unknown, f"an environment read whose name this test cannot tell: {unknown}"


def test_the_scan_sees_reads():
    """The scan finds the reads that stay outside settings (the leaf kafka_client, the codec's
    loader): a scan that saw nothing would pass the test above."""
    assert "RUST_LOG" in names_read(ROOT / "kafka_client/embedded.py")[0]
    assert environment.PURE_PYTHON.name in names_read(ROOT / "broker/native.py")[0]


def test_compose_variables_are_declared():
    used = set()
    for path in (ROOT / "deploy").glob("compose*.yaml"):
        used |= set(re.findall(r"\$\{(\w+)", path.read_text()))
    assert used, "no ${VAR} found in deploy/compose*.yaml"
    assert {n for n in used if COMPOSE not in getattr(BY_NAME.get(n), "commands", ())} == set()


def test_the_configuration_page_lists_every_variable():
    """docs/configuration.md, "Environment variables" (the README's table moved there)."""
    page = (ROOT / "docs/configuration.md").read_text()
    assert [v.name for v in ALL if f"`{v.name}`" not in page] == []


def _help(command: str, capsys) -> str:
    from broker import __main__ as broker_main
    from broker.admin import __main__ as admin_main
    from sink import maintain
    from sink.history import query
    from sink.history.job import config as job
    run = {"broker": lambda: broker_main.parse_args(["--help"]),
           "broker.admin": lambda: admin_main.build_parser().parse_args(["--help"]),
           "sink.job": lambda: job.build_parser().parse_args(["--help"]),
           "sink.query": lambda: query.main(["--help"]),
           "sink.maintain": lambda: maintain.main(["--help"])}[command]
    with pytest.raises(SystemExit):
        run()
    return capsys.readouterr().out


@pytest.mark.parametrize("command", [environment.BROKER, environment.ADMIN, environment.JOB,
                                     environment.QUERY, environment.MAINTAIN])
def test_help_lists_the_variables_its_command_reads(command, capsys):
    text = _help(command, capsys)
    mine = [v.name for v in ALL if command in v.commands]
    assert mine and "environment variables:" in text
    assert [n for n in mine if n not in text] == []
    assert [v.name for v in ALL if command not in v.commands and f"  {v.name} " in text] == []


def test_variables_keep_their_meaning(monkeypatch, tmp_path):
    """Read through their declarations, the variables do what they did."""
    from settings import secrets
    monkeypatch.setenv("SPARK_CONNECT_AUTHENTICATE_TOKEN", "tok")
    monkeypatch.setenv("MQTT_SINK_KEY", "ab" * 32)
    assert secrets.connect_token(str(tmp_path)) == "tok"
    assert secrets.sink_key(str(tmp_path)) == bytes.fromhex("ab" * 32)
    monkeypatch.setenv("MQTT_SINK_KEY", "abc")
    with pytest.raises(ValueError, match=r"\$MQTT_SINK_KEY"):
        secrets.sink_key(str(tmp_path))
    monkeypatch.setenv("SINK_LOG_LEVEL", "DEBUG")
    from sink.history.job import config_from_args
    assert config_from_args([])[1].log_level == "DEBUG"
    monkeypatch.setenv("BROKER_ADMIN_PASSWORD", "pw")
    from broker.admin.__main__ import _password
    assert _password(None, None) == "pw"
    import settings
    monkeypatch.setenv("MQTT_BROKER_MQTT__MAXIMUM_QOS", "1")
    assert settings.load(None).mqtt.maximum_qos == 1
