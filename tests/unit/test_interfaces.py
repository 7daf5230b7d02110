"""The core's objects reach each other through narrow, named interfaces (docs/architecture.md "Architecture"):

- what only looks (broker/dashboard, broker/admin, broker/observability) reads through BrokerView
  (broker/core/view.py) and changes state through a few named commands of the Broker, never its
  session table, router, retained store, counters or configuration;
- a Connection uses of its Broker only what ConnectionHost (broker/core/host.py) lists;
- a hook (the cluster, the sink's hooks, the state store, auth) uses of its Broker only what
  HookHost (broker/core/hookhost.py) lists;
- a Session changes its Connection only through the connection's methods (broker/core/session.py);
- what the server starts (the MQTT protocols, metrics, $SYS, the dashboard) gets its shared state
  (broker/transport/state.py ServerState), never the Server.

Read from the source (ast), so a new reach-in fails here with the line that makes it.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OBSERVERS = ("broker/dashboard", "broker/admin", "broker/observability")
# the commands that change the broker, which observers may call (everything read: BrokerView)
COMMANDS = {"kick", "publish_operator", "retain", "publish_local", "add_hook", "remove_hook",
            "bans",   # AdminService installs the ban list's check, asked at each CONNECT
            "auth"}   # AdminService.reload: the auth hook re-reads its files
# the core modules observers may import: the view, the message type they publish, the Hook base
OBSERVER_CORE_IMPORTS = {"view", "message", "hooks"}


# names that hold the core's objects (a private attribute of one is a reach-in: view._b ...)
CORE_NAMES = {"broker", "b", "view", "session", "sessions", "link", "conn", "connection"}


def _last_name(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else None


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _is_broker(node: ast.expr, aliases: set[str]) -> bool:
    """`x.broker` (server.broker, self.broker, self.server.broker) or a local alias of one."""
    return (isinstance(node, ast.Attribute) and node.attr == "broker") or \
        (isinstance(node, ast.Name) and node.id in aliases)


def broker_uses(path: Path, names: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """(line, attribute) of every attribute taken from a Broker in this file: x.broker.attr, or
    through a local alias (b = self.broker; b.attr), or a name in `names` (a parameter)."""
    out = []
    tree = _tree(path)
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        aliases = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign)
                   and _is_broker(n.value, set()) for t in n.targets if isinstance(t, ast.Name)}
        aliases.update(names)
        for n in ast.walk(fn):
            if isinstance(n, ast.Attribute) and _is_broker(n.value, aliases):
                out.append((n.lineno, n.attr))
    return sorted(set(out))


def test_observers_read_the_broker_only_through_its_view():
    """The dashboard, the admin API, $SYS and metrics take from the Broker only its commands;
    every figure, record, setting and clock comes from BrokerView."""
    bad = []
    for pkg in OBSERVERS:
        for path in sorted((ROOT / pkg).glob("*.py")):
            rel = path.relative_to(ROOT)
            bad += [f"{rel}:{line}: broker.{attr}" for line, attr in broker_uses(path)
                    if attr not in COMMANDS]
            for node in ast.walk(_tree(path)):
                if isinstance(node, ast.ImportFrom) and node.module and \
                        node.module.lstrip(".").startswith("core."):
                    name = node.module.lstrip(".").split(".")[1]
                    if name not in OBSERVER_CORE_IMPORTS:
                        bad.append(f"{rel}:{node.lineno}: imports core.{name}")
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                        not node.attr.startswith("__") and _last_name(node.value) in CORE_NAMES:
                    bad.append(f"{rel}:{node.lineno}: private attribute {node.attr}")
    assert bad == [], "observers reaching into the core (use BrokerView):\n" + "\n".join(bad)


# the hooks (broker/core/hooks.py) and what they hand their broker to; $SYS and metrics are
# observers above (they attach no hook), the dashboard's TopicCounter takes nothing of its broker
HOOKS = ("cluster", "sink/replay", "sink/forward", "broker/store", "broker/auth")
# the broker's containers of other core objects and its counters: never a hook's to take
BROKER_STORES = {"sessions", "router", "retained", "stats", "hooks", "queues", "connections",
                 "delayed_wills", "dirty", "received_by_qos", "sent_by_qos"}


def _protocol_members(rel: str, name: str) -> set[str]:
    tree = _tree(ROOT / rel)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}


def hook_host_members() -> set[str]:
    return _protocol_members("broker/core/hookhost.py", "HookHost")


def _hook_files() -> list[Path]:
    return [p for pkg in HOOKS for p in sorted((ROOT / pkg).glob("*.py"))]


def test_hooks_use_of_their_broker_only_what_hook_host_lists():
    """Every attribute the cluster, the sink's hooks, the state store and auth take from their
    broker (x.broker.y, b = x.broker; b.y, or a parameter named broker) is a member of HookHost
    (broker/core/hookhost.py); none of the broker's containers or counters is one of them."""
    members = hook_host_members()
    bad = []
    for path in _hook_files():
        rel = path.relative_to(ROOT)
        bad += [f"{rel}:{line}: broker.{attr}" for line, attr in broker_uses(path, names=("broker",))
                if attr not in members]
    assert bad == [], "not in HookHost (broker/core/hookhost.py):\n" + "\n".join(bad)
    assert not members & BROKER_STORES


def test_hooks_are_given_their_broker_as_a_hook_host():
    """A hook's attach() takes a HookHost, and no hook's module names the Broker class or keeps
    its broker as Any, so mypy refuses a use of the broker that HookHost does not list; mypy
    checks that Broker provides all of HookHost."""
    bad = []
    for path in [ROOT / "broker/core/hooks.py", *_hook_files()]:
        rel = path.relative_to(ROOT)
        hooks = [c for c in ast.walk(_tree(path)) if isinstance(c, ast.ClassDef)
                 and (c.name == "Hook" or "Hook" in [ast.unparse(base) for base in c.bases])]
        for c in hooks:
            for f in c.body:
                if isinstance(f, ast.FunctionDef) and f.name == "attach":
                    ann = f.args.args[1].annotation
                    if ann is None or ast.unparse(ann) != "HookHost":
                        bad.append(f"{rel}:{f.lineno}: {c.name}.attach(broker: "
                                   f"{ast.unparse(ann) if ann else 'untyped'})")
        for n in ast.walk(_tree(path)):
            if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("core.broker"):
                bad.append(f"{rel}:{n.lineno}: imports the Broker")
            if isinstance(n, ast.AnnAssign) and ast.unparse(n.target).endswith("broker") and \
                    "HookHost" not in ast.unparse(n.annotation):
                bad.append(f"{rel}:{n.lineno}: {ast.unparse(n.target)}: {ast.unparse(n.annotation)}")
    assert bad == [], "hooks typing their broker as more than a HookHost:\n" + "\n".join(bad)
    assert "def _broker_is_a_hook_host(b: Broker) -> HookHost:" in \
        (ROOT / "broker/core/hookhost.py").read_text()


def test_the_observers_check_sees_a_reach_in(tmp_path):
    """The check above finds a read of broker internals, through an alias too."""
    f = tmp_path / "x.py"
    f.write_text("def f(server):\n    b = server.broker\n    return b.sessions, server.broker.cfg\n")
    assert [a for _, a in broker_uses(f)] == ["cfg", "sessions"]


def host_members() -> set[str]:
    return _protocol_members("broker/core/host.py", "ConnectionHost")


def test_a_connection_uses_of_its_broker_only_what_connection_host_lists():
    """Every attribute a Connection takes from its broker (self.broker.x, or b = self.broker;
    b.x) is a member of ConnectionHost; and there are few of them, in named groups."""
    members = host_members()
    used = broker_uses(ROOT / "broker/core/connection.py", names=("broker",))  # __init__'s
    bad = sorted(f"connection.py:{line}: broker.{attr}" for line, attr in used if attr not in members)
    assert bad == [], "not in ConnectionHost (broker/core/host.py):\n" + "\n".join(bad)
    assert {a for _, a in used} <= members
    # none of the broker's containers of other core objects is part of the surface
    assert not members & {"sessions", "router", "retained", "connacks", "hooks", "queues",
                          "delayed_wills", "dirty"}


def test_the_broker_is_checked_to_be_a_connection_host():
    """The connection's broker is typed Broker (native calls when compiled); mypy checks that
    Broker provides all of ConnectionHost, and the test above that the connection uses no more."""
    assert "def __init__(self, broker: Broker" in (ROOT / "broker/core/connection.py").read_text()
    assert "def _broker_is_a_connection_host(b: Broker) -> ConnectionHost:" in \
        (ROOT / "broker/core/host.py").read_text()


# what a Session may use of its link (the docstring of broker/core/session.py lists the same)
LINK_READS = {"level", "receive_max", "max_packet_size", "alias_max", "paused"}
LINK_METHODS = {"write", "outbound_alias", "outbound_alias_unsent", "outbound_aliases_reset",
                "wake", "note", "write_durable"}


def _is_link(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "link") or \
        (isinstance(node, ast.Attribute) and node.attr == "connection"
         and isinstance(node.value, ast.Name) and node.value.id == "self")


def test_a_session_changes_its_connection_only_through_its_methods():
    """Session reads the client's limits of its link and calls its methods; it assigns none of
    the connection's attributes and reaches through none (link.out_aliases.pop(...) was one)."""
    path = ROOT / "broker/core/session.py"
    bad = []
    for n in ast.walk(_tree(path)):
        if not (isinstance(n, ast.Attribute) and _is_link(n.value)):
            continue
        if not isinstance(n.ctx, ast.Load):
            bad.append(f"session.py:{n.lineno}: assigns link.{n.attr}")
        elif n.attr not in LINK_READS | LINK_METHODS:
            bad.append(f"session.py:{n.lineno}: link.{n.attr}")
    for n in ast.walk(_tree(path)):  # link.x.y: reaching through the connection
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and \
                _is_link(n.value.value):
            bad.append(f"session.py:{n.lineno}: link.{n.value.attr}.{n.attr}")
    assert bad == [], "Session reaching into its Connection:\n" + "\n".join(bad)
    doc = ast.get_docstring(_tree(path)) or ""
    assert all(name in doc for name in LINK_READS | LINK_METHODS)


# the per-message path: routing, delivery, an accepted PUBLISH (bench/core_bench.py measures it)
PER_MESSAGE = {"broker/core/router.py": {"match", "pick"},
               "broker/core/broker.py": {"publish", "route", "fan_out", "deliver", "deliver_with",
                                         "deliver_shared", "offer", "retain"},
               "broker/core/connection.py": {"on_publish", "feed", "data_received", "write", "ack"},
               "broker/core/session.py": {"deliver", "_send", "_enqueue", "acked", "_freed", "pump"}}
COUNTERS = ("stats", "received_by_qos", "sent_by_qos", "sent")


def per_message_writes() -> list[tuple[str, str, str, ast.AST]]:
    """(file, function, target, node) of every attribute, or item of an attribute, written in a
    per-message function (locals and their items left out)."""
    out = []
    for rel, names in PER_MESSAGE.items():
        for fn in ast.walk(_tree(ROOT / rel)):
            if not (isinstance(fn, ast.FunctionDef) and fn.name in names):
                continue
            for n in ast.walk(fn):
                targets = [n.target] if isinstance(n, ast.AugAssign) else \
                    n.targets if isinstance(n, ast.Assign) else []
                for t in targets:
                    if isinstance(t, ast.Attribute) or \
                            (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute)):
                        out.append((rel, fn.name, ast.unparse(t), n))
    return out


def _counter(target: str) -> str | None:
    base = target.split("[")[0].split(".")[-1]
    return base if "[" in target and base in COUNTERS else None


def test_the_router_counts_nothing_per_message():
    """Routing (Router.match / pick, Broker.publish / route / fan_out / deliver*) writes no
    counter: figures are sampled by BrokerView when asked, per-topic rates come from a hook on
    accepted messages (the dashboard's TopicCounter)."""
    routing = [(f, fn, t) for f, fn, t, _ in per_message_writes()
               if f in ("broker/core/router.py", "broker/core/broker.py") and _counter(t)
               and fn != "offer"]
    assert routing == []
    router = {t for f, _, t, _ in per_message_writes() if f == "broker/core/router.py"}
    assert router <= {"self.cache_size", "self.next_member[key]", "self.cache[topic]"}


def test_per_message_counters_are_plain_increments_the_view_reads():
    """What the per-message path counts: messages received and sent by QoS (one list item + 1
    each), and drops by reason (only when a message is dropped): plain integer increments, every
    one read by BrokerView for $SYS, metrics and the dashboard."""
    found = {}
    for f, fn, t, node in per_message_writes():
        name = _counter(t)
        if name is None:
            continue
        plain = (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add)
                 and ast.unparse(node.value) == "1") or \
            (isinstance(node, ast.Assign) and ast.unparse(node.value).endswith(" + 1"))
        assert plain, f"{f} {fn}: {ast.unparse(node)} is not a plain increment"
        found.setdefault(name, set()).add(t.split("[", 1)[1].rstrip("]"))
    # every message: its QoS (Session.sent is Broker.sent_by_qos, shared)
    assert found.pop("received_by_qos") == {"qos"} and found.pop("sent") == {"qos"}
    # the rest count drops and refusals, by the name the view and metrics show
    assert all(k.strip("'\"").startswith(("dropped_", "sink_refused")) for k in found.pop("stats"))
    assert found == {}
    view = (ROOT / "broker/core/view.py").read_text()
    assert "b.received_by_qos" in view and "b.sent_by_qos" in view and "b.stats" in view


STARTED_BY_THE_SERVER = ("broker/transport", "broker/observability", "broker/dashboard", "broker/admin")


def test_what_the_server_starts_gets_its_state_not_the_server():
    """The protocols, metrics, $SYS and the dashboard are given ServerState: none imports
    broker/server.py (a service locator they could reach anything through)."""
    bad = []
    for pkg in STARTED_BY_THE_SERVER:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for n in ast.walk(_tree(path)):
                if isinstance(n, ast.ImportFrom) and n.module is not None and (
                        n.module == "server" and n.level >= 1 or n.module == "broker.server"):
                    bad.append(f"{path.relative_to(ROOT)}:{n.lineno}")
    assert bad == [], "imports the Server: " + ", ".join(bad)
