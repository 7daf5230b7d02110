"""Authentication (password file) and authorization (ACL file) for the broker.

Configured by the ``[auth]`` table of the TOML config (see config/broker.toml)::

    [auth]
    password_file = "/etc/broker/passwd"   # python -m broker.auth passwd FILE add USER
    acl_file = "/etc/broker/acl"           # python -m broker.auth check-acl FILE
    allow_anonymous = false                # default: false with a password file, else true
    client_id_pattern = "%u-*"             # optional: client ids a user may choose (else 0x85)

``from_config(cfg.auth)`` (the typed [auth] section, settings.AuthConfig) returns an
``AccessControl`` for the broker core (or None when nothing is configured: everyone may do
everything, as before).

CONNECT outcome (MQTT 5 reason code / MQTT 3.1.1 return code):

* no user name, allow_anonymous = true          -> accepted
* no user name, allow_anonymous = false         -> 0x87 Not authorized / 5 (as mosquitto)
* user name, password file, password right      -> accepted
* user name, password file, wrong/no password,
  or user not in the file                       -> 0x86 Bad User Name or Password / 4
* user name, no password file (anonymous allowed) -> accepted; the user name is NOT verified,
  so ``user`` sections of the ACL trust whatever name the client claims.

The continuous rules' client (user name ``$rules``, broker/auth/rules.py) is the broker's own
account, whatever the files say: its password is in ``<data_dir>/secrets/rules.password``, it
may publish to its rules' ``publish`` topics only and subscribe to nothing; a wrong password is
0x86 also when anonymous clients are allowed.

Topic access: see broker/auth/acl.py. Without an ACL file every connected client may publish
and subscribe to everything.

Both files are re-read when they change (checked at most every ``reload_interval`` seconds)
and by ``AccessControl.reload()`` (e.g. on SIGHUP). A reload that finds an invalid file keeps
the previous contents and logs every problem as FILE:LINE: what is wrong; at startup the same
problems stop the broker.
"""
from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Callable

from settings import AuthConfig, ConfigError

from ..core.hooks import AUTH_CHECKS, Hook
from .acl import ACL, AuthFileError, covers, file_signature, overlaps
from .passwords import PasswordFile, hash_password, verify_password
from .rules import RULES_USER, RulesAccount

if TYPE_CHECKING:
    from ..core.hookhost import HookHost

__all__ = ["AccessControl", "from_config", "ACL", "AuthFileError", "PasswordFile", "RulesAccount",
           "hash_password", "verify_password", "covers", "overlaps",
           "BAD_USER_NAME_OR_PASSWORD", "NOT_AUTHORIZED"]

log = logging.getLogger(__name__)

BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
CLIENT_IDENTIFIER_NOT_VALID = 0x85

_DEFAULT = AuthConfig()  # the one place the [auth] defaults are written: settings/tree.py


class AccessControl(Hook):
    """The auth hook of the broker core (core/hooks.py): it provides every check
    (authenticate, check_client_id, allow_publish, allow_subscribe, allow_read,
    needs_read_check)."""
    provides = frozenset(AUTH_CHECKS)

    def __init__(self, password_file: str | None = None, acl_file: str | None = None,
                 allow_anonymous: bool | None = None,
                 cache_seconds: float = _DEFAULT.cache_seconds,
                 reload_interval: float = _DEFAULT.reload_interval,
                 decision_cache_size: int = _DEFAULT.decision_cache_size,
                 client_id_pattern: str = _DEFAULT.client_id_pattern,
                 clock: Callable[[], float] = time.monotonic,
                 rules: RulesAccount | None = None) -> None:
        """rules: the continuous rules' client (None: nobody logs in as RULES_USER)."""
        if allow_anonymous is None:
            allow_anonymous = not password_file
        if not allow_anonymous and not password_file:
            raise ConfigError("auth.allow_anonymous", "needs auth.password_file (otherwise no "
                              "client could connect)", False)
        self.allow_anonymous = allow_anonymous
        self.clock = clock
        self.reload_interval = reload_interval
        self.passwords = PasswordFile(password_file, reload_interval, cache_seconds, clock=clock) \
            if password_file else None
        self.acl_file = acl_file or None
        self.acl: ACL | None = ACL.load(acl_file) if acl_file else None   # errors stop the broker
        self._acl_sig = file_signature(acl_file) if acl_file else None
        self._acl_checked = clock()
        self.decision_cache_size = decision_cache_size
        self._pub_cache: dict = {}
        self._sub_cache: dict = {}
        self._read_cache: dict = {}
        self.client_id_pattern = client_id_pattern
        self.on_acl_reload: Callable[[], None] | None = None  # set by the broker: re-flag subscriptions after a reload
        self.rules = rules
        self._warn_reserved()

    def _warn_reserved(self) -> None:
        if self.passwords is not None and RULES_USER in self.passwords.users:
            log.warning("password file %s: the entry %r is ignored: that name is the continuous "
                        "rules' client, whose password is the broker's own "
                        "(<data_dir>/secrets/rules.password); remove the entry",
                        self.passwords.path, RULES_USER)

    def attach(self, broker: HookHost) -> None:
        self.on_acl_reload = broker.flag_read_checks  # re-flag subscriptions after a reload

    # ---------------------------------------------------------------- reload
    def reload(self) -> None:
        """Re-read both files now (SIGHUP). Invalid files keep the previous contents."""
        if self.passwords is not None:
            self.passwords.reload()
            self._warn_reserved()
        if self.rules is not None:
            self.rules.refresh()
        if self.acl_file:
            self._reload_acl()

    def _reload_acl(self) -> None:
        # (only with an ACL file)
        sig = file_signature(self.acl_file)  # type: ignore[arg-type]
        self._acl_sig = sig
        try:
            acl = ACL.load(self.acl_file)  # type: ignore[arg-type]
        except AuthFileError as exc:
            log.error("ACL file not reloaded, keeping the previous rules:\n%s", exc)
            return
        self.acl = acl
        self._pub_cache = {}
        self._sub_cache = {}
        self._read_cache = {}
        if self.on_acl_reload is not None:
            self.on_acl_reload()
        log.info("ACL file %s loaded: %s", self.acl_file, acl.summary())

    def _maybe_reload_acl(self) -> None:
        now = self.clock()
        if now - self._acl_checked >= self.reload_interval:
            self._acl_checked = now
            if file_signature(self.acl_file) != self._acl_sig:  # type: ignore[arg-type]  # (with an ACL file)
                self._reload_acl()

    # ---------------------------------------------------------------- the core's interface
    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> int:
        if username == RULES_USER:  # the broker's own account, whatever the files say
            return self.rules.authenticate(password) if self.rules is not None \
                else BAD_USER_NAME_OR_PASSWORD
        if username is None:
            return 0 if self.allow_anonymous else NOT_AUTHORIZED
        if self.passwords is None:
            return 0            # anonymous allowed and nothing to check the name against
        if password is not None and not isinstance(password, bytes):
            password = bytes(password)
        return 0 if self.passwords.check(username, password) else BAD_USER_NAME_OR_PASSWORD

    def authenticate_cached(self, client_id: str, username: str | None,
                            password: bytes | None) -> int | None:
        """authenticate()'s answer when it needs no password hash, else None."""
        if username is None or self.passwords is None or username == RULES_USER:
            return self.authenticate(client_id, username, password)  # no hash to compute
        if password is not None and not isinstance(password, bytes):
            password = bytes(password)
        ok = self.passwords.cached(username, password)
        return None if ok is None else (0 if ok else BAD_USER_NAME_OR_PASSWORD)

    def needs_publish_check(self, client_id: str, username: str | None) -> bool:
        """Only the rules' client and, with an ACL file, everyone (core/hooks.py)."""
        return username == RULES_USER or bool(self.acl_file)

    def allow_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        if username == RULES_USER:
            return self.rules is not None and self.rules.may_publish(topic)
        if self.acl is None:
            return True
        self._maybe_reload_acl()
        return self._decide(self._pub_cache, self.acl.can_write, client_id, username, topic)

    def allow_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        if username == RULES_USER:
            return False  # the rules' client only publishes
        if self.acl is None:
            return True
        self._maybe_reload_acl()
        return self._decide(self._sub_cache, self.acl.can_subscribe, client_id, username,
                            topic_filter)

    def allow_read(self, client_id: str, username: str | None, topic: str) -> bool:
        """Per-message check at delivery, only for subscriptions flagged by needs_read_check.

        Hot path: one dict lookup. No reload check here: the PUBLISH being delivered just made
        one, and a reload clears this cache."""
        r = self._read_cache.get((client_id, username, topic))
        if r is None:
            if username == RULES_USER:
                return False
            if self.acl is None:
                return True
            r = self._decide(self._read_cache, self.acl.can_read, client_id, username, topic)
        return r

    def needs_read_check(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        """Whether a granted subscription overlaps deny rules (so each message is checked)."""
        return self.acl is not None and username != RULES_USER \
            and self.acl.needs_read_check(client_id, username, topic_filter)

    def check_client_id(self, client_id: str, username: str | None) -> int:
        """0, or 0x85 when client_id_pattern is set and the client id does not fit it."""
        pat = self.client_id_pattern
        if not pat or username == RULES_USER:  # (its password proves who it is)
            return 0
        if "%u" in pat and username is None:
            return CLIENT_IDENTIFIER_NOT_VALID  # the pattern names the user: anonymous never fits
        rx = ".*".join(re.escape(part).replace("%u", re.escape(username or ""))
                       for part in pat.split("*"))
        return 0 if re.fullmatch(rx, client_id, re.DOTALL) else CLIENT_IDENTIFIER_NOT_VALID

    def _decide(self, cache: dict, fn: Callable[[str, str | None, str], bool], client_id: str,
                username: str | None, topic: str) -> bool:
        if not self.decision_cache_size:
            return fn(client_id, username, topic)
        key = (client_id, username, topic)
        r = cache.get(key)
        if r is None:
            r = fn(client_id, username, topic)
            if len(cache) >= self.decision_cache_size:
                cache.clear()
            cache[key] = r
        return r


def from_config(cfg: AuthConfig | dict | None,
                rules: RulesAccount | None = None) -> AccessControl | None:
    """AccessControl from the [auth] section; None when it configures nothing (allow all)
    and no rules' client is given (``rules``: the broker's, RulesAccount.from_files).

    A dict is checked as an [auth] table. Raises ConfigError naming the key (and, for a bad
    file, its first problems).
    """
    if not isinstance(cfg, AuthConfig):
        cfg = AuthConfig.from_table(cfg)
    pw, acl = cfg.password_file or None, cfg.acl_file or None
    if pw is None and acl is None and cfg.allow_anonymous in (None, True) \
            and not cfg.client_id_pattern and rules is None:
        return None
    try:
        return AccessControl(
            password_file=pw, acl_file=acl, allow_anonymous=cfg.allow_anonymous,
            cache_seconds=cfg.cache_seconds, reload_interval=cfg.reload_interval,
            decision_cache_size=cfg.decision_cache_size, client_id_pattern=cfg.client_id_pattern,
            rules=rules)
    except AuthFileError as exc:
        key, path = ("acl_file", acl) if acl and exc.errors and exc.errors[0].startswith(acl) \
            else ("password_file", pw)
        more = f" ({len(exc.errors) - 3} more)" if len(exc.errors) > 3 else ""
        raise ConfigError(f"auth.{key}", "; ".join(exc.errors[:3]) + more, path) from None
