"""The operator's commands on a running broker: what the admin API (broker/dashboard/api.py,
/api/v1/...) and ``python -m broker.admin`` do, in one place on the broker side.

Reading goes through the core's read-only view (broker/core/view.py); changing state through
the core's own commands (Broker.kick, Broker.publish, Broker.retain) and the hooks' (the ban
list, AccessControl.reload): nothing here touches a connection's internals. Every command is
logged as an audit line on the ``broker.audit`` logger: who, from where, what, the outcome.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Iterable

from mqtt_topics import valid_topic_filter

from ..core.message import Message, topic_name_problem
from ..core.view import BrokerView
from ..protocol import properties as PR
from .bans import BanError, BanList

if TYPE_CHECKING:
    from ..core.view import RetainedRecord
    from .accounts import Accounts
    from .rules import RulesAdmin

audit_log = logging.getLogger("broker.audit")

ADMIN_CLIENT_ID = "$admin"


class AdminError(ValueError):
    """A command that cannot be done as asked: the message says why (HTTP 400)."""


class Refused(RuntimeError):
    """The broker cannot take it now (e.g. the sink's spool is full): HTTP 503."""


def _show(value: object, limit: int = 200) -> str:
    """A client-supplied string for a log line: escaped (repr) and cut."""
    text = escape(repr(value))
    return text if len(text) <= limit else text[:limit] + "...'"


def escape(text: str, limit: int = 0) -> str:
    """`text` on one line: every character that is not printable (line breaks, other control
    characters, U+2028...) as a backslash escape; cut at `limit` characters when given."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else
                       (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                       for c in text)
    return text if not limit or len(text) <= limit else text[:limit] + "..."


def audit(who: str, address: str, action: str, outcome: str = "ok", **details: object) -> None:
    """One log line per command, whatever the client put in it: every part escaped."""
    extra = "".join(f" {escape(k, 50)}={_show(v)}" for k, v in details.items())
    audit_log.info("audit: user=%s from=%s action=%s%s -> %s", _show(who, 100),
                   _show(address, 100), escape(action, 300), extra, escape(outcome, 300))


class AdminService:
    def __init__(self, broker: Any, bans: BanList | None = None, accounts: Accounts | None = None,
                 rules: RulesAdmin | None = None) -> None:
        self.broker = broker    # the Broker: its commands only (everything read: the view)
        self.view = BrokerView(broker)
        self.bans = bans
        self.accounts = accounts
        self.rules = rules      # continuous rules (admin/rules.py), or None
        if bans is not None:
            self.broker.bans = bans.check

    # ------------------------------------------------------------ clients
    def kick(self, client_id: str) -> bool:
        return self.broker.kick(client_id, "disconnected by the broker's administrator")

    # ------------------------------------------------------------ messages
    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                content_type: str | None = None, message_expiry: int | None = None,
                user_properties: Iterable[Any] = (), response_topic: str | None = None,
                utf8: bool | None = None, username: str | None = None) -> int:
        """Publish as an accepted PUBLISH is published (sink, retained, routed): how many
        sessions got it. Refused when the sink refuses it (spool full)."""
        problem = topic_name_problem(topic, "'topic'")
        if problem is not None:
            raise AdminError(problem)
        if topic.startswith("$"):
            raise AdminError("topics starting with '$' belong to the broker ($SYS)")
        if qos not in (0, 1, 2):
            raise AdminError("'qos' must be 0, 1 or 2")
        if qos > self.view.maximum_qos:
            raise AdminError(f"'qos' {qos} is above mqtt.maximum_qos "
                             f"({self.view.maximum_qos})")
        if retain and not self.view.retain_available:
            raise AdminError("retained messages are not available (mqtt.retain_available)")
        props: dict = {}
        if content_type is not None:
            props[PR.CONTENT_TYPE] = str(content_type)
        if utf8:
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                raise AdminError("the payload is not UTF-8 but 'utf8' says it is") from None
            props[PR.PAYLOAD_FORMAT_INDICATOR] = 1
        if response_topic is not None:
            props[PR.RESPONSE_TOPIC] = response_topic
        if user_properties:
            try:
                pairs = [(str(k), str(v)) for k, v in user_properties]
            except (TypeError, ValueError):
                raise AdminError("'user_properties' must be a list of [name, value] pairs") \
                    from None
            props[PR.USER_PROPERTY] = pairs
        # the checks of a client's PUBLISH (topic, payload size, the properties' strings)
        problem = self.view.message_problem(topic, payload, props)
        if problem is not None:
            raise AdminError(problem)
        expires_at = None
        if message_expiry is not None:
            if not isinstance(message_expiry, int) or not 0 < message_expiry <= 0xFFFFFFFF:
                raise AdminError("'message_expiry' must be whole seconds from 1 to 4294967295")
            expires_at = self.view.clock() + message_expiry
        msg = Message(topic, payload, qos, retain, props or None, expires_at, ADMIN_CLIENT_ID,
                      self.view.wall())
        n = self.broker.publish_operator(msg, username)
        if n is None:
            raise Refused("the sink refused the message (its spool is full): try again later")
        return n

    def delete_retained(self, topic: str) -> bool:
        # whatever is stored can be deleted, even a topic that should never have got in
        if not (isinstance(topic, str) and topic and self.view.retained_topic(topic)):
            problem = topic_name_problem(topic, "'topic'")
            if problem is not None:
                raise AdminError(problem)
            return False
        # an empty retained payload deletes [MQTT-3.3.1-6]: through the core, so the store
        # forgets it too (on_retain); nothing is routed
        self.broker.retain(Message(topic, b"", 0, True, None, None, ADMIN_CLIENT_ID,
                                   self.view.wall()))
        return True

    def retained(self, filt: str, limit: int) -> tuple[list[RetainedRecord], int]:
        if not valid_topic_filter(filt) or filt.startswith("$share/"):
            raise AdminError(f"invalid topic filter {filt!r}")
        return self.view.retained(filt, limit)

    # ------------------------------------------------------------ bans
    def _bans(self) -> BanList:
        if self.bans is None:
            raise AdminError("this broker has no ban list")
        return self.bans

    def ban(self, kind: str, value: str, reason: str = "", seconds: float | None = None,
            by: str = "") -> tuple[dict, list[str]]:
        """Add a ban; connected clients it covers are disconnected. (ban, kicked client ids)"""
        if seconds is not None and (not isinstance(seconds, (int, float)) or seconds <= 0
                                    or seconds != seconds or seconds > 100 * 365 * 86400):
            raise AdminError("'seconds' must be a number of seconds > 0 (leave it out: forever)")
        until = time.time() + seconds if seconds is not None else None
        try:
            ban = self._bans().add(kind, value, reason, until, by)
        except BanError as exc:
            raise AdminError(str(exc)) from None
        kicked = [cid for cid, user, peer in self.view.client_ids()
                  if self.bans.matches(ban, cid, user, peer)]  # type: ignore[union-attr]  # _bans() checked
        for cid in kicked:
            self.broker.kick(cid, "banned by the broker's administrator")
        return ban, kicked

    def unban(self, kind: str, value: str) -> bool:
        return self._bans().remove(kind, value)

    def list_bans(self) -> list[dict]:
        return self._bans().list() if self.bans is not None else []

    # ------------------------------------------------------------ reload
    def reload(self) -> dict:
        """Re-read the password file and the ACL (as SIGHUP does), and the dashboard accounts."""
        from ..auth.acl import ACL, AuthFileError
        from ..auth.passwords import read_password_file
        auth = self.broker.auth
        files = [(getattr(getattr(auth, "passwords", None), "path", None), read_password_file),
                 (getattr(auth, "acl_file", None), ACL.load)]
        errors: list[str] = []
        for path, read in files:
            if path:
                try:
                    read(path)
                except AuthFileError as exc:  # the broker keeps the previous contents
                    errors += [str(e) for e in exc.errors][:20]
        reload_auth = getattr(auth, "reload", None)
        if reload_auth is not None:
            reload_auth()
        if self.accounts is not None:
            self.accounts.reload()
        return {"password_file": files[0][0] or None, "acl_file": files[1][0] or None,
                "errors": errors}
