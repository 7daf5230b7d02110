"""python -m broker.admin: operators' accounts, and the admin API of a running broker.

Accounts (edits the dashboard's accounts file directly; a running broker re-reads it):

    python -m broker.admin users add NAME [--role admin|viewer] [--password P]
    python -m broker.admin users passwd NAME | role NAME ROLE | delete NAME | list

A running broker, over its dashboard's admin API (/api/v1/...):

    python -m broker.admin clients list [-q TEXT] | show ID | kick ID
    python -m broker.admin sessions list [-q TEXT] [--connected | --offline]
    python -m broker.admin subscriptions list [--client ID]
    python -m broker.admin publish TOPIC PAYLOAD [--qos N] [--retain] [--base64]
    python -m broker.admin retained list [--filter F] | delete TOPIC
    python -m broker.admin bans list | add KIND VALUE [--reason R] [--seconds S] | delete KIND VALUE
    python -m broker.admin rules list | add NAME --sql SQL [--publish TOPIC] [--table T]
    python -m broker.admin rules pause NAME | resume NAME | remove NAME
    python -m broker.admin reload | stats

Credentials for the API: --url / BROKER_ADMIN_URL (default http://127.0.0.1:18083), --user /
BROKER_ADMIN_USER (default admin), and the password from BROKER_ADMIN_PASSWORD, or the first
line of --password-file / BROKER_ADMIN_PASSWORD_FILE (default: <data_dir>/dashboard-admin-password,
the first administrator's, when it exists).
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Iterable

from settings import environment

from .accounts import PASSWORD_FILE, ROLES, delete_account, read_accounts, set_account, set_role, users_file
from .bans import KINDS
from .client import AdminClient, APIError

if TYPE_CHECKING:
    from settings import Config

DEFAULT_URL = "http://127.0.0.1:18083"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m broker.admin",
        description="Manage the dashboard's operator accounts, and a running broker through "
                    "its admin API (the dashboard's /api/v1/...).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1].rstrip() + "\n\n" + environment.epilog(environment.ADMIN))
    p.add_argument("--config", metavar="FILE", help="the broker's config (for data_dir, "
                   "[dashboard] users_file and port)")
    p.add_argument("--data-dir", metavar="DIR", help="the broker's data directory (default: "
                   "from the config, ./data)")
    p.add_argument("--url", help=f"the dashboard (default: BROKER_ADMIN_URL, else the config's "
                   f"[dashboard] port on 127.0.0.1, {DEFAULT_URL})")
    p.add_argument("--user", help="operator account (default: BROKER_ADMIN_USER, else admin)")
    p.add_argument("--password-file", metavar="FILE", help="file whose first line is the "
                   "password (default: BROKER_ADMIN_PASSWORD, BROKER_ADMIN_PASSWORD_FILE, then "
                   f"<data_dir>/{PASSWORD_FILE})")
    p.add_argument("--json", action="store_true", help="print the API's JSON answers")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    u = sub.add_parser("users", help="operator accounts of the dashboard (not MQTT users)")
    u.add_argument("--file", help="the accounts file (default: [dashboard] users_file, "
                   "<data_dir>/dashboard-users)")
    uo = u.add_subparsers(dest="op", metavar="OPERATION", required=True)
    a = uo.add_parser("add", help="add an account (or replace its password and role)")
    a.add_argument("name")
    a.add_argument("--role", choices=ROLES, default="viewer", help="default viewer (read only)")
    a.add_argument("--password", help="visible in the process list: prefer the prompt")
    pw = uo.add_parser("passwd", help="change an account's password")
    pw.add_argument("name")
    pw.add_argument("--password")
    r = uo.add_parser("role", help="change an account's role")
    r.add_argument("name")
    r.add_argument("role", choices=ROLES)
    d = uo.add_parser("delete", help="remove an account (its sessions end)")
    d.add_argument("name")
    uo.add_parser("list", help="accounts and roles")

    c = sub.add_parser("clients", help="connected clients")
    co = c.add_subparsers(dest="op", metavar="OPERATION", required=True)
    cl = co.add_parser("list")
    cl.add_argument("-q", default="", help="client ids containing this")
    cl.add_argument("--limit", type=int)
    co.add_parser("show").add_argument("client_id")
    co.add_parser("kick", help="disconnect (MQTT 5: DISCONNECT 0x98)").add_argument("client_id")

    s = sub.add_parser("sessions", help="sessions, connected and offline")
    so = s.add_subparsers(dest="op", metavar="OPERATION", required=True)
    sl = so.add_parser("list")
    sl.add_argument("-q", default="")
    sl.add_argument("--limit", type=int)
    g = sl.add_mutually_exclusive_group()
    g.add_argument("--connected", action="store_true")
    g.add_argument("--offline", action="store_true")

    sb = sub.add_parser("subscriptions", help="subscriptions of every session (or one)")
    sbo = sb.add_subparsers(dest="op", metavar="OPERATION", required=True)
    sbl = sbo.add_parser("list")
    sbl.add_argument("--client", dest="client_id")
    sbl.add_argument("-q", default="", help="filters containing this")
    sbl.add_argument("--limit", type=int)

    pb = sub.add_parser("publish", help="publish a message through the broker (retained, "
                        "routed, sent to the sink as a client's)")
    pb.add_argument("topic")
    pb.add_argument("payload")
    pb.add_argument("--qos", type=int, default=0, choices=(0, 1, 2))
    pb.add_argument("--retain", action="store_true")
    pb.add_argument("--base64", action="store_true", help="PAYLOAD is base64")
    pb.add_argument("--content-type")
    pb.add_argument("--message-expiry", type=int, metavar="SECONDS")

    rt = sub.add_parser("retained", help="retained messages")
    rto = rt.add_subparsers(dest="op", metavar="OPERATION", required=True)
    rl = rto.add_parser("list")
    rl.add_argument("--filter", default="#")
    rl.add_argument("--limit", type=int)
    rto.add_parser("delete").add_argument("topic")

    b = sub.add_parser("bans", help="banned client ids, user names and addresses")
    bo = b.add_subparsers(dest="op", metavar="OPERATION", required=True)
    bo.add_parser("list")
    ba = bo.add_parser("add", help="ban (connected clients it covers are disconnected)")
    ba.add_argument("kind", choices=KINDS)
    ba.add_argument("value", help="a client id, a user name, an IP address or network (10.0.0.0/8)")
    ba.add_argument("--reason", default="")
    ba.add_argument("--seconds", type=float, help="ban for this long (default: until removed)")
    bd = bo.add_parser("delete")
    bd.add_argument("kind", choices=KINDS)
    bd.add_argument("value")

    ru = sub.add_parser("rules", help="continuous rules: Spark SQL over the live messages, "
                        "published to a topic or appended to a table (docs/rules.md)")
    ruo = ru.add_subparsers(dest="op", metavar="OPERATION", required=True)
    ruo.add_parser("list", help="rules of the config and added here, with the job's status")
    rua = ruo.add_parser("add", help="add a rule (its SQL is checked by the running history "
                         "job's Spark first)")
    rua.add_argument("name", help="a letter, then letters, digits, '_' or '-'")
    rua.add_argument("--sql", required=True, help="a query over the stream `messages`, e.g. "
                     "\"SELECT topic, payload_text FROM messages WHERE qos > 0\"")
    rua.add_argument("--publish", default="", metavar="TOPIC",
                     help="publish each row as a JSON object to this topic (QoS 1)")
    rua.add_argument("--table", default="", metavar="NAME",
                     help="append the rows to this table of the catalog")
    rua.add_argument("--paused", action="store_true", help="add it paused")
    for op, text in (("pause", "stop running a rule (kept; resume starts it again)"),
                     ("resume", "run a paused rule again"),
                     ("remove", "remove a rule added here (a config rule: edit the config)")):
        ruo.add_parser(op, help=text).add_argument("name")

    sub.add_parser("reload", help="re-read the MQTT password file, the ACL and the accounts")
    sub.add_parser("stats", help="the broker's figures")
    return p


def _config(args: argparse.Namespace) -> Config:
    import settings
    flags = [("broker", "data_dir", args.data_dir, "--data-dir")] if args.data_dir else []
    return settings.load(args.config, flags=flags)


def _ask(prompt: str) -> str:
    first = getpass.getpass(prompt)
    if getpass.getpass("Again: ") != first:
        raise SystemExit("the passwords differ; nothing changed")
    if not first:
        raise SystemExit("an empty password; nothing changed")
    return first


def users(args: argparse.Namespace, cfg: Config) -> int:
    path = args.file or users_file(cfg.data_dir, cfg.dashboard.users_file)
    if args.op == "list":
        accounts = [{"name": a.name, "role": a.role} for a in read_accounts(path).values()]
        _print(args, {"users": accounts}, accounts, ("name", "role"))
        return 0
    if args.op == "delete":
        if not delete_account(path, args.name):
            print(f"no account {args.name!r} in {path}", file=sys.stderr)
            return 1
        print(f"removed {args.name!r} from {path}")
        return 0
    if args.op == "role":
        if not set_role(path, args.name, args.role):
            print(f"no account {args.name!r} in {path}", file=sys.stderr)
            return 1
        print(f"{args.name!r} is now {args.role}")
        return 0
    known = read_accounts(path)
    if args.op == "passwd" and args.name not in known:
        print(f"no account {args.name!r} in {path} (add it: users add {args.name})",
              file=sys.stderr)
        return 1
    role = args.role if args.op == "add" else known[args.name].role
    password = args.password or _ask(f"Password for {args.name}: ")
    new = set_account(path, args.name, role, password)
    print(f"{'added' if new else 'updated'} {args.name!r} ({role}) in {path}")
    return 0


def _password(args: argparse.Namespace, cfg: Config) -> str:
    password = environment.ADMIN_PASSWORD.get()
    if password:
        return password
    path = args.password_file or environment.ADMIN_PASSWORD_FILE.get() or \
        os.path.join(cfg.data_dir, PASSWORD_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().rstrip("\r\n")
    except OSError:
        if sys.stdin.isatty():
            return getpass.getpass("Dashboard password: ")
        raise SystemExit(f"no password: set BROKER_ADMIN_PASSWORD or BROKER_ADMIN_PASSWORD_FILE, "
                         f"or give --password-file ({path} cannot be read)") from None


def _print(args: argparse.Namespace, data: Any, rows: Iterable[dict[str, Any]] | None = None,
           columns: Iterable[str] = ()) -> None:
    if args.json or rows is None:
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    print(table(list(rows), tuple(columns)))


def table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """Rows as aligned columns under a header (as `emqx ctl` prints), "(none)" for no rows;
    --json gives the API's answer for scripts."""
    if not rows:
        return "(none)"
    cells = [[c.upper() for c in columns]]
    cells += [["-" if r.get(c) is None else str(r.get(c)).replace("\n", " ") for c in columns]
              for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip()
                     for line in cells)


def remote(args: argparse.Namespace, cfg: Config) -> int:
    url = args.url or environment.ADMIN_URL.get() or \
        f"http://127.0.0.1:{cfg.dashboard.port}"
    user = args.user or environment.ADMIN_USER.get() or "admin"
    api = AdminClient(url, user, _password(args, cfg))
    cmd, op = args.command, getattr(args, "op", None)
    if cmd == "clients" and op == "list":
        r = api.call("GET", "/api/v1/clients", q=args.q or None, limit=args.limit)
        _print(args, r, r["clients"], ("client_id", "protocol", "username", "address",
                                       "connected_since", "subscription_count", "queued"))
    elif cmd == "clients" and op == "show":
        _print(args, api.call("GET", "/api/v1/clients/" + _quote(args.client_id)))
    elif cmd == "clients" and op == "kick":
        _print(args, api.call("DELETE", "/api/v1/clients/" + _quote(args.client_id)))
    elif cmd == "sessions":
        connected = True if args.connected else False if args.offline else None
        r = api.call("GET", "/api/v1/sessions", q=args.q or None, limit=args.limit,
                     connected=None if connected is None else str(connected).lower())
        _print(args, r, r["sessions"], ("client_id", "username", "connected", "expires_in",
                                        "subscription_count", "queued", "inflight"))
    elif cmd == "subscriptions":
        r = api.call("GET", "/api/v1/subscriptions", client_id=args.client_id, q=args.q or None,
                     limit=args.limit)
        _print(args, r, r["subscriptions"], ("client_id", "filter", "qos"))
    elif cmd == "publish":
        body = {"topic": args.topic, "payload": args.payload, "qos": args.qos,
                "retain": args.retain, "encoding": "base64" if args.base64 else "utf-8"}
        if args.content_type:
            body["content_type"] = args.content_type
        if args.message_expiry:
            body["message_expiry"] = args.message_expiry
        _print(args, api.call("POST", "/api/v1/publish", body))
    elif cmd == "retained" and op == "list":
        r = api.call("GET", "/api/v1/retained", filter=args.filter, limit=args.limit)
        rows = [{**x, "payload": x.get("text", "base64:" + x.get("base64", ""))}
                for x in r["retained"]]
        _print(args, r, rows, ("topic", "qos", "at", "payload"))
    elif cmd == "retained" and op == "delete":
        _print(args, api.call("DELETE", "/api/v1/retained", topic=args.topic))
    elif cmd == "bans" and op == "list":
        r = api.call("GET", "/api/v1/bans")
        _print(args, r, r["bans"], ("kind", "value", "until", "reason", "by"))
    elif cmd == "bans" and op == "add":
        body = {"kind": args.kind, "value": args.value, "reason": args.reason}
        if args.seconds:
            body["seconds"] = args.seconds
        _print(args, api.call("POST", "/api/v1/bans", body))
    elif cmd == "bans" and op == "delete":
        _print(args, api.call("DELETE", "/api/v1/bans", kind=args.kind, value=args.value))
    elif cmd == "rules" and op == "list":
        r = api.call("GET", "/api/v1/rules")
        rows = [{**x, "target": ", ".join(filter(None, (x.get("publish"), x.get("table") and
                                                        "table " + x["table"]))),
                 "rows/s": x.get("rows_per_second"), "error": x.get("last_error")}
                for x in r["rules"]]
        _print(args, r, rows, ("name", "source", "target", "state", "rows/s", "rows", "error"))
        if not args.json and r["rules"] and r.get("status_stale"):
            age = r.get("status_age_seconds")
            print(f"(the history job's status is {'missing' if age is None else f'{age:g} s old'}"
                  f": is the job running? python -m sink.job --config <your broker.toml>)")
    elif cmd == "rules" and op == "add":
        body = {"name": args.name, "sql": args.sql}
        if args.publish:
            body["publish"] = args.publish
        if args.table:
            body["table"] = args.table
        if args.paused:
            body["paused"] = True
        _print(args, api.call("POST", "/api/v1/rules", body))
    elif cmd == "rules":
        if op == "remove":
            _print(args, api.call("DELETE", "/api/v1/rules/" + _quote(args.name)))
        else:
            _print(args, api.call("POST", f"/api/v1/rules/{_quote(args.name)}/{op}", {}))
    elif cmd == "reload":
        r = api.call("POST", "/api/v1/reload", {})
        _print(args, r)
        return 1 if r.get("errors") else 0
    elif cmd == "stats":
        _print(args, api.call("GET", "/api/v1/stats"))
    return 0


def _quote(text: str) -> str:
    import urllib.parse
    return urllib.parse.quote(text, safe="")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = _config(args)
    except ValueError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "users":
            return users(args, cfg)
        return remote(args, cfg)
    except APIError as exc:
        print(f"python -m broker.admin: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"python -m broker.admin: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
