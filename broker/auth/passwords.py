"""Password file: salted scrypt hashes, one user per line (like mosquitto_passwd).

Format::

    # comment lines and blank lines are ignored
    alice:$scrypt$16384$8$1$<salt, base64>$<hash, base64>

* ``$scrypt$N$R$P$SALT$HASH``: hashlib.scrypt (standard library, OpenSSL) with cost N (a power
  of two), block size R and parallelism P; 16-byte random salt, 32-byte hash, both standard
  base64. Defaults N=2**14, R=8, P=1 (16 MiB of memory, roughly 50-150 ms of CPU per check).
  Create and edit the file with ``python -m broker.auth passwd FILE add|delete|list``.
* ``$7$ITERATIONS$SALT$HASH``: what Mosquitto 2's ``mosquitto_passwd`` writes, PBKDF2-HMAC-SHA512
  (hashlib.pbkdf2_hmac) with that many iterations (mosquitto_passwd's default: 101), a 12-byte
  salt and a 64-byte hash, standard base64: a Mosquitto password file works as it is. Its
  default is far cheaper to guess than scrypt: re-create those users with ``passwd add`` when
  you can. (``$6$``, Mosquitto 1.x's single salted SHA-512, is refused: re-create the user.)
* User names may not contain ':' or line breaks. Passwords are the raw bytes the client sends
  (the CLI stores the UTF-8 encoding of what you type).
* Comparison is constant-time (hmac.compare_digest); a user name that is not in the file is
  checked against a dummy hash with the default parameters, so it costs about the same time
  as a wrong password and response timing does not reveal which user names exist.
* Reload: the file's (mtime, size, inode) is checked at most every ``reload_interval`` seconds
  when a client authenticates, and the file is re-read when it changed. A file that became
  invalid (or disappeared) keeps the previous users and logs the error with file:line.

Verification cache (``cache_seconds``, default 120, 0 disables): scrypt is deliberately slow, so
a reconnect storm of thousands of devices would keep the check threads busy for minutes. The
outcome of a check (accepted or refused) is therefore remembered for ``cache_seconds``, keyed by
HMAC-SHA256(per-process random key, user name + password): the cache never holds a password or a
reusable hash of one, and a new guess always pays the full scrypt price, so the cache does not
speed up password guessing. The cache is cleared whenever the file is reloaded (so a changed or
deleted user takes effect at the next check after the reload) and bounded to
``cache_max_entries`` entries. The trade-off: a memory dump of the broker process exposes HMAC
values that, together with the key from the same dump, could be brute-forced much faster than
scrypt. Set cache_seconds = 0 if that matters more than reconnect storms.

The broker runs every check that may hash (any CONNECT with a user name) on a small thread
pool with a bounded queue (broker/auth/checks.py), never on its event loop; a flood of
CONNECTs with *distinct* wrong passwords still costs one scrypt each, and beyond
``max_pending_checks`` CONNECTs are refused with Server busy. Rate-limit connections in front
of the broker (load balancer / firewall) if exposed.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import threading
import time
from collections import Counter
from typing import Any, Callable

from .acl import AuthFileError, file_signature

log = logging.getLogger(__name__)

DEFAULT_N = 2 ** 14
DEFAULT_R = 8
DEFAULT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
# refuse parameters from a file that would make one check allocate absurd memory/CPU
MAX_N = 2 ** 20
MAX_R = 32
MAX_P = 16
MAX_ITERATIONS = 1_000_000  # PBKDF2 ($7$): about half a second of CPU per check at most
FORMATS = "USER:$scrypt$N$R$P$SALT$HASH (or mosquitto_passwd's USER:$7$ITERATIONS$SALT$HASH)"


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int, dklen: int = HASH_BYTES) -> bytes:
    maxmem = 128 * r * (n + p + 2) + (1 << 20)
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=dklen)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def hash_password(password: str | bytes, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P,
                  salt: bytes | None = None) -> str:
    """'$scrypt$N$R$P$SALT$HASH' for a password (str is encoded as UTF-8)."""
    if isinstance(password, str):
        password = password.encode("utf-8")
    _check_params(n, r, p)
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    return f"$scrypt${n}${r}${p}${_b64(salt)}${_b64(_scrypt(password, salt, n, r, p))}"


def _check_params(n: int, r: int, p: int) -> None:
    if n < 2 or n & (n - 1) or n > MAX_N:
        raise ValueError(f"scrypt N must be a power of two between 2 and {MAX_N}, not {n}")
    if not 1 <= r <= MAX_R:
        raise ValueError(f"scrypt R must be between 1 and {MAX_R}, not {r}")
    if not 1 <= p <= MAX_P:
        raise ValueError(f"scrypt P must be between 1 and {MAX_P}, not {p}")


class Hash:
    """A parsed '$scrypt$...' or '$7$...' (PBKDF2-SHA512, mosquitto_passwd) string; `kind` is
    "scrypt" or "7" (then `n` is the iteration count)."""
    __slots__ = ("kind", "n", "r", "p", "salt", "digest", "text")

    def __init__(self, text: str) -> None:
        parts = text.split("$")
        if len(parts) == 5 and not parts[0] and parts[1] == "7":
            kind, numbers, encoded = "7", parts[2:3], parts[3:]
        elif len(parts) == 7 and not parts[0] and parts[1] == "scrypt":
            kind, numbers, encoded = "scrypt", parts[2:5], parts[5:]
        elif len(parts) == 4 and not parts[0] and parts[1] == "6":
            raise ValueError("$6$ hashes (Mosquitto 1.x, one round of salted SHA-512) are not "
                             "accepted: set the password again with: python -m broker.auth passwd "
                             "FILE add USER (or mosquitto_passwd of Mosquitto 2, $7$)")
        else:
            raise ValueError(f"expected {FORMATS.partition(':')[2]} "
                             "(create lines with: python -m broker.auth passwd FILE add USER)")
        try:
            values = [int(x) for x in numbers]
        except ValueError:
            raise ValueError("scrypt N, R and P must be integers" if kind == "scrypt" else
                             "the $7$ iteration count must be an integer") from None
        if kind == "scrypt":
            n, r, p = values
            _check_params(n, r, p)
        else:
            n, r, p = values[0], 0, 0
            if not 1 <= n <= MAX_ITERATIONS:
                raise ValueError(f"the $7$ iteration count must be between 1 and {MAX_ITERATIONS}, "
                                 f"not {n}")
        try:
            salt = base64.b64decode(encoded[0], validate=True)
            digest = base64.b64decode(encoded[1], validate=True)
        except ValueError:
            raise ValueError("salt and hash must be base64") from None
        if not salt or len(digest) < 16:
            raise ValueError("salt is empty or hash is shorter than 16 bytes")
        self.kind, self.n, self.r, self.p = kind, n, r, p
        self.salt, self.digest, self.text = salt, digest, text

    def verify(self, password: bytes) -> bool:
        if self.kind == "7":
            got = hashlib.pbkdf2_hmac("sha512", password, self.salt, self.n, len(self.digest))
        else:
            got = _scrypt(password, self.salt, self.n, self.r, self.p, len(self.digest))
        return hmac.compare_digest(got, self.digest)

    def dummy(self) -> "Hash":
        """A hash of the same kind and cost with a random salt and digest: checking an unknown
        user against it costs what checking this one costs, and never matches."""
        salt, digest = _b64(os.urandom(len(self.salt))), _b64(os.urandom(len(self.digest)))
        if self.kind == "7":
            return Hash(f"$7${self.n}${salt}${digest}")
        return Hash(f"$scrypt${self.n}${self.r}${self.p}${salt}${digest}")


def verify_password(encoded: str, password: str | bytes) -> bool:
    if isinstance(password, str):
        password = password.encode("utf-8")
    return Hash(encoded).verify(password)


def valid_username(name: str) -> str | None:
    """None when the name can be stored, else what is wrong with it."""
    if not name:
        return "the user name is empty"
    if ":" in name:
        return "a user name may not contain ':'"
    if any(ch in name for ch in "\r\n\0"):
        return "a user name may not contain line breaks or NUL"
    if name != name.strip():
        return "a user name may not start or end with spaces"
    return None


def parse_hash_lines(text: str, path: str, *, expected: str, noun: str, fields: int = 0,
                     check: Callable[[str, list[str], str], str | None] | None = None,
                     ) -> dict[str, tuple[list[str], Hash]]:
    """The lines NAME[:FIELD...]:HASH of a password file (blank lines and # comments skipped) as
    {NAME: ([the FIELDs], Hash)}: `fields` between NAME and HASH (none in this module's file, the
    ROLE in the dashboard accounts, broker/admin/accounts.py). AuthFileError lists every bad line
    as FILE:LINE: problem: too few ':' (`expected` says the format), a bad name, what
    check(NAME, FIELDs, HASH text) finds wrong, a name twice, or a hash that does not parse
    (`noun` names the entry: "user 'bob' appears twice")."""
    entries: dict[str, tuple[list[str], Hash]] = {}
    errors: list[str] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{no}"
        parts = line.split(":", fields + 1)
        if len(parts) < fields + 2:
            errors.append(f"{where}: expected {expected}")
            continue
        name, *between, encoded = parts
        problem = valid_username(name) or (check(name, between, encoded) if check else None)
        if problem:
            errors.append(f"{where}: {problem}")
            continue
        if name in entries:
            errors.append(f"{where}: {noun} {name!r} appears twice")
            continue
        try:
            entries[name] = (between, Hash(encoded.strip()))
        except ValueError as exc:
            errors.append(f"{where}: {noun} {name!r}: {exc}")
    if errors:
        raise AuthFileError(errors)
    return entries


def parse_password_file(text: str, path: str = "<passwords>") -> dict[str, Hash]:
    return {name: h for name, (_, h) in
            parse_hash_lines(text, path, expected=FORMATS, noun="user").items()}


def read_password_file(path: str) -> dict[str, Hash]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise AuthFileError([f"{path}: password file not found "
                             f"(create it with: python -m broker.auth passwd {path} add USER)"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthFileError([f"{path}: cannot read the password file: {exc}"]) from None
    return parse_password_file(text, path)


class PasswordFile:
    """The users of a password file, re-read when it changes, with a verification cache."""

    def __init__(self, path: str, reload_interval: float = 2.0, cache_seconds: float = 120.0,
                 cache_max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.reload_interval = reload_interval
        self.cache_seconds = cache_seconds
        self.cache_max_entries = cache_max_entries
        self.clock = clock
        import secrets  # secrets and tempfile where used: the broker imports this module
        self._key = secrets.token_bytes(32)  # also without a password file
        self._cache: dict[bytes, tuple[float, bool]] = {}
        self._dummy: Hash | None = None
        self._lock = threading.Lock()
        self.users: dict[str, Hash] = read_password_file(path)   # errors here stop the broker
        self._sig = file_signature(path)
        self._checked = clock()
        self.reloads = 0

    # ---------------------------------------------------------------- reload
    def maybe_reload(self) -> None:
        now = self.clock()
        if now - self._checked < self.reload_interval:
            return
        self._checked = now
        if file_signature(self.path) != self._sig:
            self.reload()

    def reload(self) -> bool:
        """Re-read the file; on error keep the current users and log it. True when reloaded."""
        sig = file_signature(self.path)
        try:
            users = read_password_file(self.path)
        except AuthFileError as exc:
            log.error("password file not reloaded, keeping the previous %d user(s):\n%s",
                      len(self.users), exc)
            self._sig = sig    # don't retry (and log) until it changes again
            return False
        with self._lock:
            self.users = users
            self._sig = sig
            self._cache.clear()
            self._dummy = None  # made again from the new file's hashes
        self.reloads += 1
        log.info("password file %s loaded: %d user(s)", self.path, len(users))
        return True

    # ---------------------------------------------------------------- checking
    def _dummy_hash(self) -> Hash:
        """What an unknown user is checked against: a hash of the kind and cost most users of
        the file have (random salt and digest, never matches), so the time of an answer does
        not tell whether the user exists; scrypt's defaults for an empty file."""
        if self._dummy is None:
            kinds = Counter((h.kind, h.n, h.r, h.p, len(h.salt), len(h.digest))
                            for h in self.users.values())
            model = next((h for h in self.users.values()
                          if (h.kind, h.n, h.r, h.p, len(h.salt), len(h.digest))
                          == kinds.most_common(1)[0][0]), None) if kinds else None
            self._dummy = model.dummy() if model is not None else Hash(
                f"$scrypt${DEFAULT_N}${DEFAULT_R}${DEFAULT_P}$"
                f"{_b64(os.urandom(SALT_BYTES))}${_b64(os.urandom(HASH_BYTES))}")
        return self._dummy

    def _cache_key(self, username: str, password: bytes, no_password: bool = False) -> bytes:
        u = username.encode("utf-8", "surrogatepass")
        msg = (b"N" if no_password else b"P") + len(u).to_bytes(4, "big") + u + password
        return hmac.new(self._key, msg, hashlib.sha256).digest()

    def check(self, username: str, password: bytes | None) -> bool:
        """Whether the password is the user's. Unknown users cost a dummy scrypt."""
        self.maybe_reload()
        no_password = password is None
        if no_password:
            password = b""
        key = None
        if self.cache_seconds > 0:
            key = self._cache_key(username, password, no_password)  # type: ignore[arg-type]  # b"" for None
            hit = self._lookup(key)
            if hit is not None:
                return hit
        users = self.users
        h = users.get(username)
        if h is None:
            self._dummy_hash().verify(password)  # type: ignore[arg-type]  # (as above)
            ok = False
        else:
            ok = h.verify(password) and not no_password  # type: ignore[arg-type]
        if key is not None:
            with self._lock:
                if users is self.users:      # not reloaded meanwhile
                    if len(self._cache) >= self.cache_max_entries:
                        self._evict()
                    self._cache[key] = (self.clock() + self.cache_seconds, ok)
        return ok

    def cached(self, username: str, password: bytes | None) -> bool | None:
        """The remembered outcome of this exact check, or None when it needs a hash
        (microseconds: the broker answers cached checks on its event loop)."""
        if self.cache_seconds <= 0:
            return None
        self.maybe_reload()
        return self._lookup(self._cache_key(username, password or b"", password is None))

    def _lookup(self, key: bytes) -> bool | None:
        hit = self._cache.get(key)
        if hit is not None:
            if hit[0] > self.clock():
                return hit[1]
            self._cache.pop(key, None)
        return None

    def _evict(self) -> None:
        now = self.clock()
        for k in [k for k, (exp, _) in self._cache.items() if exp <= now]:
            del self._cache[k]
        if len(self._cache) >= self.cache_max_entries:
            self._cache.clear()


# ------------------------------------------------------------------------- file editing (CLI)
def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def _write_lines(path: str, lines: list[str]) -> None:
    """Atomic replace (temp file + rename) keeping the file private (0600)."""
    import tempfile
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".passwd-", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        try:
            st = os.stat(path)
            os.chmod(tmp, st.st_mode & 0o7777)
        except FileNotFoundError:
            os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def set_user(path: str, username: str, password: str | bytes, **params: Any) -> bool:
    """Add or replace a user; True when the user was new. Other lines are kept as they are."""
    problem = valid_username(username)
    if problem:
        raise ValueError(problem)
    return put_line(path, username, f"{username}:{hash_password(password, **params)}")


def delete_user(path: str, username: str) -> bool:
    return delete_line(path, username)


def put_line(path: str, name: str, line: str) -> bool:
    """`line` in place of NAME's line of a NAME:... file, or appended (True: NAME was new)."""
    lines = _read_lines(path)
    for i, old in enumerate(lines):
        if old.strip().partition(":")[0] == name and not old.strip().startswith("#"):
            lines[i] = line
            _write_lines(path, lines)
            return False
    lines.append(line)
    _write_lines(path, lines)
    return True


def delete_line(path: str, name: str) -> bool:
    """NAME's line of a NAME:... file removed (False: there was none)."""
    lines = _read_lines(path)
    keep = [x for x in lines
            if x.strip().startswith("#") or x.strip().partition(":")[0] != name or not x.strip()]
    if len(keep) == len(lines):
        return False
    _write_lines(path, keep)
    return True
