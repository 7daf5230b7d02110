"""How many of the project's functions are annotated: every parameter (but self/cls) and the
return (``__init__`` may leave it out, as mypy allows).

    .venv/bin/python scripts/annotation_share.py [DIR ...]     # default: the project's packages

Prints one line per package and the total; mypy (pyproject.toml [tool.mypy]) checks the bodies.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("broker", "cluster", "kafka_client", "mqtt_topics", "settings", "sink")


def annotated(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> bool:
    a = fn.args
    params = a.posonlyargs + a.args + a.kwonlyargs
    if method and params and params[0].arg in ("self", "cls", "mcs"):
        params = params[1:]
    params += [p for p in (a.vararg, a.kwarg) if p is not None]
    if any(p.annotation is None for p in params):
        return False
    return fn.returns is not None or (fn.name == "__init__" and bool(params))


def count(path: Path) -> tuple[int, int]:
    tree = ast.parse(path.read_text(), str(path))
    total = done = 0
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            total += 1
            done += annotated(node, id(node) in methods)
    return total, done


def main(argv: list[str]) -> int:
    dirs = [Path(d) for d in argv] or [ROOT / p for p in PACKAGES]
    all_total = all_done = 0
    for d in dirs:
        files = sorted(d.rglob("*.py")) if d.is_dir() else [d]
        total = done = 0
        for f in files:
            t, n = count(f)
            total, done = total + t, done + n
        all_total, all_done = all_total + total, all_done + done
        print(f"{d.name:<14} {done:5d} / {total:5d} functions annotated ({100 * done / max(total, 1):.0f}%)")
    print(f"{'total':<14} {all_done:5d} / {all_total:5d} functions annotated "
          f"({100 * all_done / max(all_total, 1):.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
