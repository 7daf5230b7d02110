"""The secrets the broker, its forwarder, the history job, sink.query and the dashboard share.

They live in ``<data_dir>/secrets/`` (mode 0700), one file each (mode 0600), made at the first
start of whoever needs them first, and are read from there by the others (every program takes
the data directory from the same config, ``data_dir``, or ``--data-dir``):

``spark_connect.token``
    The bearer token of the history job's Spark Connect server (Spark's
    ``spark.connect.authenticate.token``). Made by the job when missing; read by ``sink.query``
    and the dashboard. ``$SPARK_CONNECT_AUTHENTICATE_TOKEN`` (Spark's and PySpark's own
    variable) overrides it everywhere.
``sink.key``
    32 random bytes (hex): the broker's key. Made by the broker's sink when missing; read by the
    history job. Two keys are derived from it: one signs every Kafka record the forwarder sends
    (header ``mqtt.sig``, checked by the job, which drops records without a valid one), one
    signs the job's committed file (sink/history/commits.py; the broker ignores a file whose signature
    fails). ``$MQTT_SINK_KEY`` (64 hex digits) overrides it everywhere.

``cluster.key``
    32 random bytes (hex): the key every node of a cluster signs its Kafka records with
    (cluster/trust.py); the nodes ignore records without a valid signature. All the nodes need
    the same key: ``cluster.key_file`` names it (default this file; made when missing, which
    suits nodes sharing one data directory; scripts/cluster.sh makes one for its nodes), and
    ``$MQTT_CLUSTER_KEY`` (64 hex digits) overrides it.

Whoever can read these files can query the history and write records the job accepts: run the
broker and the job as one user, and keep the data directory to that user.

A leaf module: the standard library only.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets as _random
import stat
from collections.abc import Callable

from . import environment

log = logging.getLogger(__name__)

DIR_NAME = "secrets"
TOKEN_FILE = "spark_connect.token"
KEY_FILE = "sink.key"
CLUSTER_KEY_FILE = "cluster.key"
TOKEN_ENV = environment.SPARK_CONNECT_TOKEN.name
KEY_ENV = environment.SINK_KEY.name

#: what each derived key signs (sink.key -> HMAC(sink.key, purpose))
RECORDS = b"mqtt-sink records v1"
COMMITTED = b"mqtt-sink committed v1"
CLUSTER_RECORDS = b"mqtt-cluster records v1"


def secrets_dir(data_dir: str) -> str:
    return os.path.join(data_dir or ".", DIR_NAME)


def secret_path(data_dir: str, name: str) -> str:
    return os.path.join(secrets_dir(data_dir), name)


def _read(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077:
            # readable or writable by others: no longer a secret of this user
            if st.st_uid == os.getuid():
                os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
            log.warning("%s was open to other users (mode %o): it may be known to them; delete "
                        "it to make a new one", path, stat.S_IMODE(st.st_mode))
        with os.fdopen(fd, "r", closefd=False) as f:
            text = f.read().strip()
    finally:
        os.close(fd)
    return text or None


def read_or_create(path: str, make: Callable[[], str], create: bool = True) -> str | None:
    """The secret in ``path``; when missing and ``create``, a new one from ``make()``, written
    0600 (in a 0700 directory) under a temporary name and linked into place, so concurrent
    starters agree on one secret and nobody reads a half-written file."""
    text = _read(path)
    if text is not None or not create:
        return text
    d = os.path.dirname(path)
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.stat(d)
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(d, 0o700)
    tmp = f"{path}.new{os.getpid()}-{_random.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (make() + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        log.info("made a new secret %s (mode 0600)", path)
    except FileExistsError:
        pass                      # made by someone else meanwhile: theirs wins
    finally:
        os.unlink(tmp)
    return _read(path)


def connect_token(data_dir: str, create: bool = False) -> str | None:
    """The Spark Connect token: $SPARK_CONNECT_AUTHENTICATE_TOKEN, else the file (made when
    missing if ``create``: the job does), else None."""
    env = environment.SPARK_CONNECT_TOKEN.get()
    if env:
        return env
    return read_or_create(secret_path(data_dir, TOKEN_FILE), lambda: _random.token_urlsafe(32), create)


def sink_key(data_dir: str, create: bool = False) -> bytes | None:
    """The broker's key: $MQTT_SINK_KEY, else the file (made when missing if ``create``: the
    broker's sink does), else None."""
    text = environment.SINK_KEY.get() or read_or_create(
        secret_path(data_dir, KEY_FILE), lambda: _random.token_hex(32), create)
    if text is None:
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        where = "$" + KEY_ENV if environment.SINK_KEY.is_set() else secret_path(data_dir, KEY_FILE)
        raise ValueError(f"the sink key ({where}) must be at least 32 hex digits")
    return key


def cluster_key(path: str, create: bool = True) -> bytes:
    """The cluster's key: $MQTT_CLUSTER_KEY, else the file ``path`` (made when missing if
    ``create``). Raises ValueError when it is not at least 32 hex digits."""
    text = environment.CLUSTER_KEY.get() or read_or_create(path, lambda: _random.token_hex(32),
                                                           create)
    where = "$" + environment.CLUSTER_KEY.name if environment.CLUSTER_KEY.is_set() else path
    if text is None:
        raise ValueError(f"no cluster key in {where}: give every node the same key file "
                         "(cluster.key_file; 64 hex digits, e.g. openssl rand -hex 32)")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ValueError(f"the cluster key ({where}) must be at least 32 hex digits "
                         "(e.g. openssl rand -hex 32)")
    return key


def derive(key: bytes, purpose: bytes) -> bytes:
    return hmac.digest(key, purpose, "sha256")


def key_id(key: bytes) -> bytes:
    """4 bytes naming a key (not revealing it): tells "signed with another key" from "forged"."""
    return hashlib.sha256(b"key id " + key).digest()[:4]


# ---- Spark Connect clients ------------------------------------------------------------------

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def client_url(url: str, token: str | None) -> str:
    """The sc:// URL a PySpark client uses to reach ``url`` with ``token``.

    PySpark sends a token only over an encrypted channel, except to the host name
    ``localhost`` (gRPC local credentials): a loopback address is written as ``localhost``.
    Other hosts need TLS in front of the server (`;use_ssl=true`)."""
    if not token:
        return url
    rest = url[len("sc://"):] if url.startswith("sc://") else url
    hostport, sep, params = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    if host in LOOPBACK:
        hostport = f"localhost:{port}"
    params = ";".join(p for p in params.split(";") if p and not p.startswith("token="))
    return f"sc://{hostport}/;{params + ';' if params else ''}token={token}"
