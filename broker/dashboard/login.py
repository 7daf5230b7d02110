"""Logging operators in to the dashboard: password checks, sessions, throttling.

* Password checks (scrypt, tens of milliseconds of CPU) run on their own small thread pool with
  a bounded queue (broker/auth/checks.py's CheckQueue, ``[dashboard] login_threads`` and
  ``max_pending_logins``), apart from the MQTT password checks: a login flood costs at most
  ``login_threads`` cores, and beyond the bound a login is answered at once with 503 Busy.
* Failures are throttled per account and address: after ``login_failures`` wrong passwords for
  one account from one address, that pair's password checks take turns one second apart: an
  attempt waits for its turn and is then checked, so the owner's right password still gets in
  after a short wait while someone guesses from the same address (at most one guess a second
  per pair). An attempt whose turn would be more than ``login_lockout_seconds`` away, or beyond
  ``max_waiting_logins`` attempts waiting at once, is answered 429 with Retry-After at once,
  nothing hashed. A good login clears the pair.
* A good login opens a server-side session (a random token in a cookie: HttpOnly,
  SameSite=Strict, Secure on https), so the page and scripts do not hash on every request.
  Sessions end after ``session_seconds``, on logout, and at once when the account is removed or
  its password or role changes (each session is tied to the account's role and password hash
  at login; the accounts file is re-read when it changed before a request is served); at most
  ``max_login_sessions`` are held (the oldest goes first).
* HTTP Basic credentials (scripts, the CLI) are checked once; the same credentials then reuse
  that session (remembered as an HMAC under a per-process key, never the password) while the
  account is unchanged: after a password change the old credentials are checked again, and
  fail.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

from ..auth.checks import CheckQueue

if TYPE_CHECKING:
    from ..admin.accounts import Accounts

COOKIE = "broker_session"
MAX_THROTTLED_ADDRESSES = 10_000   # (account, address) pairs remembered


class Busy(Exception):
    """Too many password checks pending: answer 503 with Retry-After."""


class Session:
    """`stamp`: the account's role and password hash at login (Accounts.stamp): when the file
    says otherwise the session ends."""
    __slots__ = ("token", "user", "role", "csrf", "expires", "address", "stamp")

    def __init__(self, user: str, role: str, expires: float, address: str,
                 stamp: str | None = None) -> None:
        self.token = secrets.token_urlsafe(32)
        self.csrf = secrets.token_urlsafe(24)
        self.user, self.role, self.expires, self.address = user, role, expires, address
        self.stamp = stamp


class Sessions:
    """token -> Session, bounded and expiring (clock: monotonic seconds)."""

    def __init__(self, lifetime: float, max_sessions: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime = lifetime
        self.max_sessions = max_sessions
        self.clock = clock
        self.by_token: OrderedDict[str, Session] = OrderedDict()
        self._basic: dict[bytes, str] = {}   # HMAC(user, password) -> token
        self._key = secrets.token_bytes(32)

    def open(self, user: str, role: str, address: str, basic: bytes | None = None,
             stamp: str | None = None) -> Session:
        now = self.clock()
        self.expire(now)
        while len(self.by_token) >= self.max_sessions:
            self.close(next(iter(self.by_token)))
        s = Session(user, role, now + self.lifetime, address, stamp)
        self.by_token[s.token] = s
        if basic is not None:
            self._basic[basic] = s.token
        return s

    def get(self, token: str | None) -> Session | None:
        if not token:
            return None
        s = self.by_token.get(token)
        if s is None:
            return None
        if s.expires <= self.clock():
            self.close(token)
            return None
        return s

    def for_basic(self, key: bytes) -> Session | None:
        token = self._basic.get(key)
        s = self.get(token)
        if s is None and token is not None:
            self._basic.pop(key, None)
        return s

    def basic_key(self, user: str, password: bytes) -> bytes:
        u = user.encode("utf-8", "surrogatepass")
        return hmac.new(self._key, len(u).to_bytes(4, "big") + u + password,
                        hashlib.sha256).digest()

    def close(self, token: str) -> None:
        s = self.by_token.pop(token, None)
        if s is not None and self._basic:
            for k in [k for k, t in self._basic.items() if t == token]:
                del self._basic[k]

    def expire(self, now: float) -> None:
        for t in [t for t, s in self.by_token.items() if s.expires <= now]:
            self.close(t)

    def __len__(self) -> int:
        return len(self.by_token)


class Throttle:
    """Wrong passwords per (account, address). After `free` failures of a pair, its password
    checks take turns `spacing` seconds apart: an attempt waits for its turn (then it is checked,
    so the right password gets in), at most `max_wait` seconds; one whose turn would come later
    is refused at once, nothing hashed. A right password clears the pair; an hour without a
    failure starts it over. At most `max_keys` pairs are remembered (the oldest failure goes)."""

    def __init__(self, free: int, max_wait: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = MAX_THROTTLED_ADDRESSES, spacing: float = 1.0) -> None:
        self.free = free
        self.max_wait = max_wait
        self.spacing = spacing
        self.clock = clock
        self.max_keys = max_keys
        # (account, address) -> [failures, next free turn, last failure]
        self.state: OrderedDict[tuple[str, str], list] = OrderedDict()
        self.refused = 0

    def turn(self, key: tuple[str, str]) -> float | None:
        """Seconds this attempt waits before its password is checked (0: now), its turn taken;
        None: refused (every turn within max_wait is taken)."""
        st = self.state.get(key)
        if st is None or st[0] < self.free:
            return 0.0
        now = self.clock()
        if now - st[2] > 3600:   # quiet for an hour: start over
            del self.state[key]
            return 0.0
        slot = max(now, st[1])
        if slot - now > self.max_wait:
            self.refused += 1
            return None
        st[1] = slot + self.spacing
        return slot - now

    def retry_after(self, key: tuple[str, str]) -> float:
        """Seconds until a refused attempt of this pair may get a turn."""
        st = self.state.get(key)
        if st is None:
            return 0.0
        return max(self.spacing, st[1] - self.clock() - self.max_wait)

    def failed(self, key: tuple[str, str]) -> None:
        now = self.clock()
        st = self.state.pop(key, None)
        if st is None or now - st[2] > 3600:   # new, or quiet for an hour: start over
            st = [0, 0.0, now]
            while len(self.state) >= self.max_keys:
                self.state.popitem(last=False)   # the pair that failed longest ago
        st[0] += 1
        st[2] = now
        self.state[key] = st

    def succeeded(self, key: tuple[str, str]) -> None:
        self.state.pop(key, None)


class LoginChecks:
    """Account password checks on a bounded pool (role or None), off the event loop."""

    def __init__(self, accounts: Accounts, threads: int, max_pending: int) -> None:
        self.accounts = accounts
        self.queue = CheckQueue(threads, max_pending)

    async def check(self, address: str, user: str, password: bytes) -> tuple[str, str] | None:
        """(role, stamp) when the password is right (Accounts.login), else None."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def done(result: tuple[str, str] | None) -> None:
            if not fut.done():
                fut.set_result(result)
        if not self.queue.submit(address, lambda: self.accounts.login(user, password),
                                 lambda: not fut.cancelled(), done):
            raise Busy()
        return await fut

    @property
    def pending(self) -> int:
        return self.queue.pending

    @property
    def refused(self) -> int:
        return self.queue.refused

    def close(self) -> None:
        self.queue.close()
