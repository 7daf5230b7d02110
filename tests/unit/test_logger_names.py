"""Every module logs under its own module name, so a log line says which file wrote it and an
operator can raise or lower one part (`logging.getLogger("sink.forward")`) by its package path.

The only hand-written logger names are channels an operator filters on by name, each listed
here with where it is documented.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "sink", "cluster", "kafka_client", "settings", "mqtt_topics")
CHANNELS = {"broker.audit": "README: administrative changes are logged on the `broker.audit` logger"}
# loggers of libraries whose level we set, not ours
FOREIGN = {"kafka", "py4j", "SQLQueryContextLogger"}


def _logger_names() -> list[tuple[str, int, str]]:
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "getLogger" and node.args):
                    arg = node.args[0]
                    names = {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)}
                    if names & {"__name__", "__spec__"}:
                        name = "__name__"  # (or, run with python -m, its module path: __spec__.name)
                    elif isinstance(arg, ast.Constant) and path.name == "__main__.py" and \
                            arg.value == path.parent.name:
                        name = "__name__"  # python -m PACKAGE logs as the package it starts
                    else:
                        name = arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg)
                    found.append((str(path.relative_to(ROOT)), node.lineno, name))
    return found


def test_modules_log_under_their_own_name():
    names = _logger_names()
    assert len(names) > 30, "the scan found the modules' loggers"
    wrong = [f"{p}:{line} getLogger({n!r})" for p, line, n in names
             if n != "__name__" and n not in CHANNELS and n not in FOREIGN]
    assert not wrong, "use logging.getLogger(__name__): " + ", ".join(wrong)


def test_every_named_channel_is_in_use():
    used = {n for _, _, n in _logger_names()}
    assert set(CHANNELS) <= used


def test_a_module_run_with_python_m_logs_under_its_module_path_not_main():
    """`python -m PACKAGE.MODULE` runs the module as __main__: its log lines must still say
    PACKAGE.MODULE (logging.getLogger(__spec__.name) there), not "__main__"."""
    bad = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            src = path.read_text()
            if path.name == "__main__.py" or 'if __name__ == "__main__":' not in src:
                continue
            for line in src.splitlines():
                if line.startswith("log = logging.getLogger(") and "__spec__" not in line:
                    bad.append(str(path.relative_to(ROOT)))
    assert not bad, "run as __main__, these log as '__main__': " + ", ".join(bad)
