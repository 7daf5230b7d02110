"""Banned client ids, user names and addresses (EMQX's banned list, Mosquitto's dynsec disable).

A CONNECT whose client id, user name or address is banned gets CONNACK 0x8A Banned (MQTT 3.1.1:
return code 5, not authorized) and is closed, before its password is checked. Addresses are an
IP address or a network (``10.0.0.0/8``, ``2001:db8::/32``). A ban may end at a time (``until``,
epoch seconds) or never. The list is kept in ``<data_dir>/bans.json`` (replaced atomically, mode
0600) and read back at start, so bans survive restarts.

In a cluster the list is the cluster's: each change made here is also handed to ``shared``
(cluster/node.py writes it to the cluster's control topic), and every node applies the changes
it reads there with ``apply_shared`` (so a ban made through one node refuses and disconnects
the client on all of them).

The broker core calls ``BanList.check`` (set as ``Broker.bans``): a few dict lookups per CONNECT,
nothing per message.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable

log = logging.getLogger(__name__)

KINDS = ("clientid", "username", "address")
BANS_FILE = "bans.json"
MAX_BANS = 100_000
MAX_VALUE = 1024


class BanError(ValueError):
    """A ban that cannot be stored: the message says what is wrong."""


def peer_address(peer: str) -> str:
    """'127.0.0.1' from '127.0.0.1:5555' / 'ws:[::1]:5555' / '::1:5555'."""
    if peer.startswith("ws:"):
        peer = peer[3:]
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return host.strip("[]")


class BanList:
    def __init__(self, path: str | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.bans: dict[tuple[str, str], dict] = {}
        self._networks: list = []   # (network, key) for address bans that are networks
        # a cluster's: told of every change made through add() / remove() ("ban", ban) or
        # ("unban", {"kind", "value"})
        self.shared: Callable[[str, dict], None] | None = None
        if path:
            self._load()

    # ------------------------------------------------------------ the core's check
    def check(self, client_id: str, username: str | None, peer: str) -> str | None:
        """Why this CONNECT is banned, or None."""
        if not self.bans:
            return None
        now = self.clock()
        hit = self._active(("clientid", client_id), now)
        if hit is None and username is not None:
            hit = self._active(("username", username), now)
        if hit is None:
            hit = self._address(peer_address(peer), now)
        if hit is None:
            return None
        return f"banned {hit['kind']} {hit['value']!r}" + \
            (f": {hit['reason']}" if hit.get("reason") else "")

    __call__ = check

    def _active(self, key: tuple[str, str], now: float) -> dict | None:
        b = self.bans.get(key)
        if b is None or (b["until"] is not None and b["until"] <= now):
            return None
        return b

    def _address(self, addr: str, now: float) -> dict | None:
        hit = self._active(("address", addr), now)
        if hit is not None or not self._networks:
            return hit
        import ipaddress  # ipaddress and json: only with bans (the file, an address)
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            return None
        for net, key in self._networks:
            if ip.version == net.version and ip in net:
                hit = self._active(key, now)
                if hit is not None:
                    return hit
        return None

    def matches(self, ban: dict, client_id: str, username: str | None, peer: str) -> bool:
        """Whether a connected client falls under one ban (to disconnect it)."""
        kind, value = ban["kind"], ban["value"]
        if kind == "clientid":
            return client_id == value
        if kind == "username":
            return username is not None and username == value
        addr = peer_address(peer)
        if addr == value:
            return True
        import ipaddress
        try:
            return ipaddress.ip_address(addr) in ipaddress.ip_network(value, strict=False)
        except ValueError:
            return False

    # ------------------------------------------------------------ editing
    def list(self) -> list[dict]:
        now = self.clock()
        self._prune(now)
        return sorted((dict(b) for b in self.bans.values()), key=lambda b: (b["kind"], b["value"]))

    def add(self, kind: str, value: str, reason: str = "", until: float | None = None,
            by: str = "") -> dict:
        if kind not in KINDS:
            raise BanError(f"'kind' must be one of {', '.join(KINDS)}, not {kind!r}")
        if not isinstance(value, str) or not value or len(value) > MAX_VALUE:
            raise BanError(f"'value' must be a non-empty string of at most {MAX_VALUE} characters")
        if kind == "address":
            value = _normal_address(value)
        if until is not None and until <= self.clock():
            raise BanError("'until' is in the past")
        if len(self.bans) >= MAX_BANS and (kind, value) not in self.bans:
            self._prune(self.clock())
            if len(self.bans) >= MAX_BANS:
                raise BanError(f"the ban list holds {MAX_BANS} entries: remove some first")
        ban = {"kind": kind, "value": value, "reason": str(reason or "")[:500], "until": until,
               "at": self.clock(), "by": by}
        self.bans[(kind, value)] = ban
        self._index()
        self._save()
        if self.shared is not None:
            self.shared("ban", dict(ban))
        return dict(ban)

    def remove(self, kind: str, value: str) -> bool:
        if kind == "address":
            try:
                value = _normal_address(value)
            except BanError:
                pass
        if self.bans.pop((kind, value), None) is None:
            return False
        self._index()
        self._save()
        if self.shared is not None:
            self.shared("unban", {"kind": kind, "value": value})
        return True

    def apply_shared(self, ban: dict, removed: bool) -> dict | None:
        """A change made through another node of the cluster (or this one, read back): the ban
        as now held (None when removed, expired or not a ban). Not handed to ``shared``."""
        kind, value, until = ban.get("kind"), ban.get("value"), ban.get("until")
        if kind not in KINDS or not isinstance(value, str) or not value or \
                len(value) > MAX_VALUE or (until is not None and not isinstance(until, (int, float))):
            return None
        if kind == "address":
            try:
                value = _normal_address(value)
            except BanError:
                return None
        if removed or (until is not None and until <= self.clock()):
            if self.bans.pop((kind, value), None) is not None:
                self._index()
                self._save()
            return None
        new = {"kind": kind, "value": value, "reason": str(ban.get("reason") or "")[:500],
               "until": until, "at": ban.get("at"), "by": str(ban.get("by") or "")}
        if self.bans.get((kind, value)) != new:
            if (kind, value) not in self.bans and len(self.bans) >= MAX_BANS:
                log.warning("a ban from the cluster was not kept: the ban list holds %d entries",
                            MAX_BANS)
                return None
            self.bans[(kind, value)] = new
            self._index()
            self._save()
        return dict(new)

    def _prune(self, now: float) -> None:
        gone = [k for k, b in self.bans.items() if b["until"] is not None and b["until"] <= now]
        if gone:
            for k in gone:
                del self.bans[k]
            self._index()
            self._save()

    def _index(self) -> None:
        import ipaddress
        nets = []
        for (kind, value), _ in self.bans.items():
            if kind == "address" and "/" in value:
                nets.append((ipaddress.ip_network(value, strict=False), (kind, value)))
        self._networks = nets

    # ------------------------------------------------------------ the file
    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:  # type: ignore[arg-type]  # with a path only
                import json
                data = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise BanError(f"{self.path}: cannot read the ban list: {exc} (fix or remove the "
                           "file; python -m broker.admin bans list shows what a running broker "
                           "holds)") from None
        now = self.clock()
        for b in data.get("bans", []) if isinstance(data, dict) else []:
            try:
                kind, value = b["kind"], b["value"]
                until = b.get("until")
                if kind not in KINDS or not isinstance(value, str) or \
                        (until is not None and not isinstance(until, (int, float))):
                    raise KeyError(kind)
                if kind == "address":
                    value = _normal_address(value)
            except (KeyError, TypeError, BanError):
                log.warning("%s: skipped a ban that is not one: %r", self.path, b)
                continue
            if until is not None and until <= now:
                continue
            self.bans[(kind, value)] = {"kind": kind, "value": value,
                                        "reason": str(b.get("reason") or ""), "until": until,
                                        "at": b.get("at"), "by": str(b.get("by") or "")}
        self._index()
        if self.bans:
            log.info("ban list %s: %d ban(s)", self.path, len(self.bans))

    def _save(self) -> None:
        if not self.path:
            return
        import json

        from .accounts import _write_private
        _write_private(self.path, json.dumps({"bans": list(self.bans.values())}, indent=1) + "\n")


def _normal_address(value: str) -> str:
    import ipaddress
    try:
        if "/" in value:
            return str(ipaddress.ip_network(value, strict=False))
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise BanError(f"{value!r} is not an IP address or network (e.g. 192.0.2.7, "
                       "10.0.0.0/8, 2001:db8::/32)") from None


def bans_file(data_dir: str) -> str:
    return os.path.join(data_dir, BANS_FILE)
