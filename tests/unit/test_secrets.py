"""Shared secrets (settings/secrets.py): made once, 0600 in a 0700 directory, read by everyone from
the same data directory; the committed file the broker trusts is signed (sink/history/commits.py)."""
from __future__ import annotations

import os
import stat
import threading

from settings import secrets
from sink.history import commits


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_made_once_private_and_read_back(tmp_path, monkeypatch):
    monkeypatch.delenv(secrets.TOKEN_ENV, raising=False)
    monkeypatch.delenv(secrets.KEY_ENV, raising=False)
    data = str(tmp_path / "data")
    assert secrets.connect_token(data) is None and secrets.sink_key(data) is None   # readers never make them
    token = secrets.connect_token(data, create=True)
    key = secrets.sink_key(data, create=True)
    assert len(token) >= 40 and len(key) == 32
    assert mode(secrets.secrets_dir(data)) == 0o700
    assert mode(secrets.secret_path(data, secrets.TOKEN_FILE)) == 0o600
    assert mode(secrets.secret_path(data, secrets.KEY_FILE)) == 0o600
    assert secrets.connect_token(data) == token and secrets.sink_key(data, create=True) == key
    monkeypatch.setenv(secrets.TOKEN_ENV, "from-env")
    assert secrets.connect_token(data) == "from-env"


def test_concurrent_starters_agree_on_one_secret(tmp_path, monkeypatch):
    monkeypatch.delenv(secrets.KEY_ENV, raising=False)
    got = []
    threads = [threading.Thread(target=lambda: got.append(secrets.sink_key(str(tmp_path), create=True)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len(set(got)) == 1 and got[0] is not None
    assert os.listdir(secrets.secrets_dir(str(tmp_path))) == [secrets.KEY_FILE]   # no temporary left


def test_a_secret_others_can_read_is_closed_and_reported(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(secrets.TOKEN_ENV, raising=False)
    secrets.connect_token(str(tmp_path), create=True)
    path = secrets.secret_path(str(tmp_path), secrets.TOKEN_FILE)
    os.chmod(path, 0o644)
    secrets.connect_token(str(tmp_path))
    assert mode(path) == 0o600 and "open to other users" in caplog.text


def test_client_url_sends_the_token_to_localhost_only():
    assert secrets.client_url("sc://127.0.0.1:15002", "T") == "sc://localhost:15002/;token=T"
    assert secrets.client_url("sc://[::1]:15002", "T") == "sc://localhost:15002/;token=T"
    assert secrets.client_url("sc://db1:15002/;use_ssl=true", "T") == "sc://db1:15002/;use_ssl=true;token=T"
    assert secrets.client_url("sc://127.0.0.1:15002", None) == "sc://127.0.0.1:15002"


def test_committed_file_signature(tmp_path):
    """The broker trusts only a committed file signed with its key: an unsigned file, one signed
    with another key, or one edited after signing is reported as such."""
    path = str(tmp_path / commits.FILE_NAME)
    key, other = b"k" * 32, b"o" * 32
    topics = {"m": {"topic_id": "A", "offsets": {0: 10}}}
    commits.write_committed(path, 3, topics, key=key, table="/t")
    st = commits.read_committed(path, key)
    assert st["signature"] == "ok" and st["table"] == "/t" and st["topics"]["m"]["offsets"] == {0: 10}
    assert commits.read_committed(path, other)["signature"] == "bad"
    raw = open(path).read().replace('"0":10', '"0":99999')
    open(path, "w").write(raw)
    assert commits.read_committed(path, key)["signature"] == "bad"
    commits.write_committed(path, 3, topics)
    assert commits.read_committed(path, key)["signature"] == "unsigned"
    assert commits.read_committed(path)["signature"] == "unchecked"


def test_the_cluster_key_is_made_once_private_or_taken_from_the_environment(tmp_path, monkeypatch):
    """cluster.key_file: made when missing (0600), read back the same; $MQTT_CLUSTER_KEY wins; a
    key that is not 32+ hex digits is refused with what to do."""
    import pytest

    from settings import environment
    monkeypatch.delenv(environment.CLUSTER_KEY.name, raising=False)
    path = str(tmp_path / "keys" / "cluster.key")
    key = secrets.cluster_key(path)
    assert len(key) == 32 and mode(path) == 0o600 and secrets.cluster_key(path) == key
    with pytest.raises(ValueError, match="no cluster key"):
        secrets.cluster_key(str(tmp_path / "missing"), create=False)
    monkeypatch.setenv(environment.CLUSTER_KEY.name, "ab" * 32)
    assert secrets.cluster_key(path) == b"\xab" * 32
    monkeypatch.setenv(environment.CLUSTER_KEY.name, "short")
    with pytest.raises(ValueError, match="at least 32 hex digits"):
        secrets.cluster_key(path)
