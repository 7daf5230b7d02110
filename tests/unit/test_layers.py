"""The packages depend on each other in one direction (docs/architecture.md "Layout"): a new import against it,
or a cycle between the modules of a package, fails here.

    mqtt_topics, settings,        leaves: the standard library (and, for kafka_client,
    kafka_client                  kafka-python, numpy, crc32c) only
    broker                        the broker: mqtt_topics, settings
    sink                          the analytics sink, a hook of the broker: + broker, kafka_client
    cluster                       the cluster, a hook of the broker: + broker, kafka_client

Entry points (`__main__.py`, `python -m ...`) put the parts together and may import any.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mqtt_topics", "settings", "kafka_client", "broker", "sink", "cluster")
ALLOWED = {
    "mqtt_topics": set(),
    "settings": set(),
    "kafka_client": set(),
    "broker": {"mqtt_topics", "settings"},
    "sink": {"broker", "kafka_client", "mqtt_topics", "settings"},
    "cluster": {"broker", "kafka_client", "mqtt_topics", "settings"},
}


def imports(path: Path, typing_only: bool = True) -> set[str]:
    """Absolute module names a file imports (function-level imports included; those under
    `if TYPE_CHECKING:`, which only the type checker runs, unless typing_only is False)."""
    out = set()
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    if not typing_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING",
                                                                        "typing.TYPE_CHECKING"):
                skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the file's package
                base = path.relative_to(ROOT).with_suffix("").parts[:-node.level]
                mod = ".".join(base + ((node.module,) if node.module else ()))
                out |= {f"{mod}.{a.name}" for a in node.names} | {mod}
            elif node.module:
                out.add(node.module)
                out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        yield path


def test_packages_import_only_the_layers_below_them():
    bad = []
    for pkg in PACKAGES:
        for path in modules(pkg):
            if path.name == "__main__.py":
                continue  # an entry point puts the parts together
            for name in imports(path):
                top = name.split(".")[0]
                if top in PACKAGES and top != pkg and top not in ALLOWED[pkg]:
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert bad == [], "imports against the layering:\n" + "\n".join(sorted(set(bad)))


def test_no_import_cycles_between_the_modules_of_a_package():
    """Module-level and function-level imports alike (a lazy import is still a dependency); not
    the imports under `if TYPE_CHECKING:` (annotations naming a class of a module that imports
    this one: nothing is imported when the program runs)."""
    for pkg in PACKAGES:
        graph: dict[str, set[str]] = {}
        names = {str(p.relative_to(ROOT).with_suffix("")).replace("/", ".").removesuffix(".__init__")
                 for p in modules(pkg)}
        for path in modules(pkg):
            me = str(path.relative_to(ROOT).with_suffix("")).replace("/", ".").removesuffix(".__init__")
            deps = set()
            for name in imports(path, typing_only=False):
                while name and name not in names:
                    name = name.rpartition(".")[0]
                if name and name != me and not me.startswith(name + "."):
                    deps.add(name)  # (a module's own package __init__ is not a cycle)
            graph[me] = deps
        cycles = []
        state: dict[str, int] = {}

        def visit(m, stack):
            state[m] = 1
            for d in graph.get(m, ()):
                if state.get(d) == 1:
                    cycles.append(stack[stack.index(d):] + [d] if d in stack else [m, d])
                elif d not in state:
                    visit(d, stack + [d])
            state[m] = 2

        for m in sorted(graph):
            if m not in state:
                visit(m, [m])
        # a package's __init__ re-exporting its modules is not a cycle worth failing on
        cycles = [c for c in cycles if not any(x == pkg or x.endswith(".__init__") for x in c)]
        assert cycles == [], f"{pkg}: import cycles {cycles}"
