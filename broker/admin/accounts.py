"""Operators' accounts for the dashboard and the admin API: separate from device credentials.

The MQTT password file ([auth] password_file) holds device credentials; none of them logs in to
the dashboard. Operators have their own file (``[dashboard] users_file``, default
``<data_dir>/dashboard-users``), one account a line::

    # NAME:ROLE:$scrypt$N$R$P$SALT$HASH
    admin:admin:$scrypt$16384$8$1$...
    grafana:viewer:$scrypt$16384$8$1$...

Roles (as EMQX's administrator / viewer): ``admin`` may do everything, ``viewer`` may read
(live figures, clients, topics, history) and change nothing. Passwords are hashed like the MQTT
password file (broker/auth/passwords.py: salted scrypt, constant-time comparison, a dummy hash
for unknown names). Manage the file with ``python -m broker.admin users ...``; the broker
re-reads it when it changes.

First start: with no account in the file the broker creates ``[dashboard] initial_admin`` with
``initial_admin_password`` (config or MQTT_BROKER_DASHBOARD__INITIAL_ADMIN_PASSWORD) or, when
that is empty, a random password written to ``<data_dir>/dashboard-admin-password`` (mode 0600),
and logs where it is.
"""
from __future__ import annotations

import logging
import os
import secrets
import threading

from ..auth.acl import AuthFileError, file_signature
from ..auth.passwords import (
    _read_lines,
    _write_lines,
    delete_line,
    hash_password,
    parse_hash_lines,
    put_line,
    valid_username,
    verify_password,
)

log = logging.getLogger(__name__)

ROLES = ("admin", "viewer")
USERS_FILE = "dashboard-users"
PASSWORD_FILE = "dashboard-admin-password"
# verified against when the name is unknown: costs a real scrypt, never matches
_DUMMY = hash_password(secrets.token_bytes(16))


class Account:
    __slots__ = ("name", "role", "hash")

    def __init__(self, name: str, role: str, hash_: str) -> None:
        self.name, self.role, self.hash = name, role, hash_


def parse_accounts(text: str, path: str = "<accounts>") -> dict[str, Account]:
    """{name: Account}; AuthFileError listing every bad line as FILE:LINE: problem (the lines
    are the MQTT password file's, broker/auth/passwords.py, with a ROLE after the name)."""
    entries = parse_hash_lines(text, path, fields=1, noun="account", check=_check_role,
                               expected="NAME:ROLE:$scrypt$... "
                                        "(add accounts with: python -m broker.admin users add NAME)")
    return {name: Account(name, role, h.text) for name, ([role], h) in entries.items()}


def _check_role(name: str, between: list[str], encoded: str) -> str | None:
    role = between[0]
    if role not in ROLES:
        return f"role {role!r} of {name!r} is not one of {', '.join(ROLES)}"
    if not encoded.startswith("$"):
        return f"the password of {name!r} is not a hash"
    return None


def read_accounts(path: str) -> dict[str, Account]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthFileError([f"{path}: cannot read the dashboard accounts: {exc}"]) from None
    return parse_accounts(text, path)


def set_account(path: str, name: str, role: str, password: str | bytes) -> bool:
    """Add or replace an account (True: new); the file stays 0600 and is replaced atomically."""
    problem = valid_username(name)
    if problem:
        raise ValueError(problem)
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    return put_line(path, name, f"{name}:{role}:{hash_password(password)}")


def set_role(path: str, name: str, role: str) -> bool:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    lines = _read_lines(path)
    for i, old in enumerate(lines):
        n, _, rest = old.strip().partition(":")
        if not old.strip().startswith("#") and n == name:
            lines[i] = f"{name}:{role}:{rest.partition(':')[2]}"
            _write_lines(path, lines)
            return True
    return False


def delete_account(path: str, name: str) -> bool:
    return delete_line(path, name)


class Accounts:
    """The accounts file of a running broker: re-read when it changes, checked off the loop."""

    def __init__(self, path: str, reload_interval: float = 2.0) -> None:
        self.path = path
        self.reload_interval = reload_interval
        self._lock = threading.Lock()
        self.accounts = read_accounts(path)   # errors here stop the broker
        self._sig = file_signature(path)

    def reload(self) -> bool:
        sig = file_signature(self.path)
        if sig == self._sig:
            return False
        try:
            accounts = read_accounts(self.path)
        except AuthFileError as exc:
            log.error("dashboard accounts not reloaded, keeping the previous %d:\n%s",
                      len(self.accounts), exc)
            self._sig = sig
            return False
        with self._lock:
            self.accounts, self._sig = accounts, sig
        log.info("dashboard accounts %s loaded: %d account(s)", self.path, len(accounts))
        return True

    def role(self, name: str) -> str | None:
        a = self.accounts.get(name)
        return a.role if a is not None else None

    def stamp(self, name: str) -> str | None:
        """What a login session of `name` is tied to: its role and password hash as the file
        says now (None: no such account). A session whose stamp changed (a new password, another
        role, the account removed) ends."""
        a = self.accounts.get(name)
        return f"{a.role}:{a.hash}" if a is not None else None

    def login(self, name: str, password: bytes) -> tuple[str, str] | None:
        """(role, stamp) of the account when the password is right, else None; both of the
        account the password was checked against. Slow (scrypt): call it in a worker thread."""
        a = self.accounts.get(name)
        ok = verify_password(a.hash if a is not None else _DUMMY, password)
        return (a.role, f"{a.role}:{a.hash}") if ok and a is not None else None

    def check(self, name: str, password: bytes) -> str | None:
        """The account's role when the password is right, else None. Slow (scrypt): call it in
        a worker thread. An unknown name costs a dummy hash too."""
        a = self.accounts.get(name)
        ok = verify_password(a.hash if a is not None else _DUMMY, password)
        return a.role if ok and a is not None else None

    def ensure_first_admin(self, name: str, password: str, data_dir: str) -> str | None:
        """With no account at all: create `name` (role admin). Returns the file holding its
        random password (password ""), "" when the configured password was used, None when
        accounts existed already."""
        if self.accounts:
            return None
        where = ""
        if not password:
            password = secrets.token_urlsafe(18)
            where = os.path.join(data_dir, PASSWORD_FILE)
            _write_private(where, password + "\n")
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        set_account(self.path, name, "admin", password)
        self._sig = None
        self.reload()
        return os.path.abspath(where) if where else ""


def _write_private(path: str, text: str) -> None:
    """Create or replace a file readable by its owner only (0600 from the start)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def users_file(data_dir: str, configured: str = "") -> str:
    return configured or os.path.join(data_dir, USERS_FILE)
