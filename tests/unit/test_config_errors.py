"""Every configuration error is one ConfigError from the loader: which key, the value and where it
came from, what is wrong and what is allowed, on one line (README "Configuration and
precedence")."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import settings
from settings import ConfigError, sections
from settings.checks import Num

ROOT = Path(__file__).resolve().parents[2]


def load_set(*items, env=None):
    return settings.load(None, env=env or {}, sets=list(items))


# (--set item, key named in the message, texts the message must contain: what is allowed)
BAD_SETS = [
    ("sink.durability=bogus", "sink.durability", ["'bogus'", "'spool', 'async', 'none'"]),
    ("sink.keep_until=forever", "sink.keep_until", ["'kafka', 'history'"]),
    ("sink.forwarder=fork", "sink.forwarder", ["'process', 'thread'"]),
    ("sink.forwarders=0", "sink.forwarders", ["from 1 to 256"]),
    ("sink.spool_max_bytes=lots", "sink.spool_max_bytes", ["whole number >= 1"]),
    ("sink.spool_segment_bytes=10", "sink.spool_segment_bytes", [">= 4096"]),
    ("sink.replay_window_seconds=-1", "sink.replay_window_seconds", ["number >= 0"]),
    ("sink.embedded_port=70000", "sink.embedded_port", ["from 0 to 65535"]),
    ("sink.bootstrap_servers=kafka", "sink.bootstrap_servers", ["HOST:PORT"]),
    ("sink.forwarder_cpus=a,b", "sink.forwarder_cpus", ["whole numbers >= 0"]),
    ("sink.enabled=yes", "sink.enabled", ["true or false"]),
    ("sink.kafka=acks", "sink.kafka", ["[sink.kafka]"]),
    ("sink.durabilty=spool", "sink.durabilty", ["unknown setting", "did you mean sink.durability?"]),
    ("mqtt.receive_maximum=0", "mqtt.receive_maximum", ["from 1 to 65535"]),
    ("mqtt.receive_maximum=abc", "mqtt.receive_maximum", ["whole number from 1 to 65535"]),
    ("mqtt.maximum_qos=3", "mqtt.maximum_qos", ["from 0 to 2"]),
    ("mqtt.maximum_packet_size=268435456", "mqtt.maximum_packet_size", ["to 268435455"]),
    ("mqtt.topic_alias_maximum=65536", "mqtt.topic_alias_maximum", ["from 0 to 65535"]),
    ("mqtt.session_expiry_maximum=-1", "mqtt.session_expiry_maximum", ["from 0 to 4294967295"]),
    ("mqtt.connect_timeout=0", "mqtt.connect_timeout", ["number > 0"]),
    ("mqtt.close_linger_seconds=-2", "mqtt.close_linger_seconds", ["number >= 0"]),
    ("mqtt.close_linger_bytes=1.5", "mqtt.close_linger_bytes", ["whole number >= 0"]),
    ("mqtt.retain_available=maybe", "mqtt.retain_available", ["true or false"]),
    ("mqtt.max_connections=-1", "mqtt.max_connections", ["whole number >= 0"]),
    ("mqtt.recieve_maximum=5", "mqtt.recieve_maximum", ["did you mean mqtt.receive_maximum?"]),
    ("broker.port=65536", "broker.port", ["from 0 to 65535"]),
    ("broker.log_level=LOUD", "broker.log_level", ["'DEBUG', 'INFO', 'WARNING', 'ERROR'"]),
    ("broker.log_format=xml", "broker.log_format", ["'text', 'json'"]),
    ("persistence.synchronous=sometimes", "persistence.synchronous", ["'NORMAL', 'FULL'"]),
    ("persistence.max_pending_changes=0", "persistence.max_pending_changes", [">= 1"]),
    ("persistence.enabled=2", "persistence.enabled", ["true or false"]),
    ("metrics.port=http", "metrics.port", ["from 0 to 65535"]),
    ("metrics.sys_interval=-5", "metrics.sys_interval", [">= 0"]),
    ("history.source=spark", "history.source", ["'auto', 'kafka', 'python'"]),
    ("history.trigger_seconds=0", "history.trigger_seconds", ["number > 0"]),
    ("history.dedup_window=1d", "history.dedup_window", ["'24 hours'"]),
    ("history.starting_offsets=first", "history.starting_offsets", ["'earliest', 'latest'"]),
    ("history.connect_port=0", "history.connect_port", ["from 1 to 65535"]),
    ("history.nice=20", "history.nice", ["from 0 to 19"]),
    ("dashboard.sample_seconds=0", "dashboard.sample_seconds", ["from 0.2 to 3600"]),
    ("dashboard.connect_url=http://x:1", "dashboard.connect_url", ["sc://HOST:PORT"]),
    ("dashboard.keep_points=5", "dashboard.keep_points", ["from 10 to 100000"]),
    ("auth.max_pending_checks=0", "auth.max_pending_checks", [">= 1"]),
    ("auth.cache_seconds=-1", "auth.cache_seconds", [">= 0"]),
    ("auth.allow_anonymous=nope", "auth.allow_anonymous", ["true or false"]),
    ("auth.passwd_file=x", "auth.passwd_file", ["did you mean auth.password_file?"]),
    ("sinks.durability=spool", "sinks.durability", ["unknown section", "did you mean sink?"]),
    ("listeners.port=1", "listeners.port", ["[[listeners]] tables in the config file"]),
    ("nodot=1", "--set", ["SECTION.KEY=VALUE"]),
    ("sink.durability", "--set", ["SECTION.KEY=VALUE"]),
    (".x=1", "--set", ["SECTION.KEY=VALUE"]),
]


def assert_one_line(exc: ConfigError, key: str, wanted: list[str]) -> str:
    msg = str(exc)
    assert exc.key == key, msg
    assert msg.startswith(key), msg
    assert "\n" not in msg
    for text in wanted:
        assert text in msg, f"{text!r} not in {msg!r}"
    return msg


@pytest.mark.parametrize("item,key,wanted", BAD_SETS, ids=[c[0] for c in BAD_SETS])
def test_bad_set(item, key, wanted):
    with pytest.raises(ConfigError) as e:
        load_set(item)
    msg = assert_one_line(e.value, key, wanted)
    if key != "--set":
        assert "(--set)" in msg  # where the value came from


BAD_FILES = [
    ('[sink]\ndurability = "bogus"\n', "sink.durability", ["'spool', 'async', 'none'", "(b.toml)"]),
    ("[mqtt]\nreceive_maximum = \"10\"\n", "mqtt.receive_maximum", ["'10'", "whole number"]),
    ("[mqtt]\nreceive_maximum = 10.5\n", "mqtt.receive_maximum", ["whole number"]),
    ("[mqtt]\nmaximum_qos = true\n", "mqtt.maximum_qos", ["from 0 to 2"]),
    ("[mqtt]\nrecieve_maximum = 10\n", "mqtt.recieve_maximum", ["did you mean mqtt.receive_maximum?"]),
    ("[mqtt]\nreceive_maximum = \n", "--config", ["b.toml:2: not valid TOML", "line 2"]),
    ("[mqtt\n", "--config", ["b.toml:1: not valid TOML", "line 1"]),
    ("[mqtt]\nreceive_maximum = 5\n\n[auth]\nallow_anonymous = yes\n", "--config",
     ["b.toml:5: not valid TOML"]),
    ('[broker]\nhost = "unterminated\n', "--config", ["b.toml:2: not valid TOML"]),
    ("[sinks]\nx = 1\n", "[sinks]", ["unknown section", "did you mean sink?"]),
    ("port = 1883\n", "port", ["outside any table", "broker.port"]),
    ("mqtt = 5\n", "mqtt", ["outside any table"]),
    ("[sink]\nrules = [{ filter = \"a/#\" }]\n", "sink.rules", ["filter", "topic"]),
    ("[sink]\nexclude = [1, 2]\n", "sink.exclude", ["list of strings"]),
    ("[sink]\nbootstrap_servers = [\"k1:9092\", \"k2\"]\n", "sink.bootstrap_servers", ["HOST:PORT"]),
    ("[sink]\nforwarder_cpus = [-1]\n", "sink.forwarder_cpus", ["whole numbers >= 0"]),
    ("[history]\nkafka_topics = 5\n", "history.kafka_topics", ["list of strings"]),
    ("[history]\nconnect = \"yes\"\n", "history.connect", ["true or false"]),
    ("[history]\nkafka = \"SASL\"\n", "history.kafka", ["[history.kafka]"]),
    ("[dashboard]\nallowed_hosts = \"a\"\nport = 1.5\n", "dashboard.port", ["whole number from 0 to 65535"]),
    ("[auth]\npassword_file = 5\n", "auth.password_file", ["a string"]),
    ("listeners = 5\n", "listeners", ["[[listeners]] tables"]),
    ("[[listeners]]\ntype = \"quic\"\nport = 1\n", "listeners[0].type",
     ["'tcp', 'tls', 'ws', 'wss'"]),
    ("[[listeners]]\nport = 1\n[[listeners]]\ntype = \"ws\"\n", "listeners[1].port",
     ["needs a port"]),
    ("[[listeners]]\ntype = \"ws\"\nport = 99999\n", "listeners[0].port", ["from 0 to 65535"]),
    ("[[listeners]]\ntype = \"ws\"\nport = 1\npath = \"mqtt\"\n", "listeners[0].path", ['"/"']),
    ("[[listeners]]\ntype = \"tls\"\nport = 1\n", "listeners[0].certfile", ["needs certfile"]),
    ("[[listeners]]\ntype = \"tcp\"\nport = 1\nuse_identity_as_username = true\n",
     "listeners[0].use_identity_as_username", ["tls or wss", "cafile"]),
    ("[[listeners]]\ntype = \"ws\"\nport = 1\nprot = 2\n", "listeners[0].prot",
     ["did you mean listeners.port?"]),
]


@pytest.mark.parametrize("text,key,wanted", BAD_FILES, ids=[c[1] for c in BAD_FILES])
def test_bad_file(tmp_path, text, key, wanted):
    f = tmp_path / "b.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        settings.load(str(f), env={})
    assert_one_line(e.value, key, wanted)


def test_missing_and_unreadable_file(tmp_path):
    for path, wanted in ((tmp_path / "nope.toml", "does not exist"),
                         (tmp_path, "cannot read the file")):
        with pytest.raises(ConfigError) as e:
            settings.load(str(path), env={})
        assert_one_line(e.value, "--config", [wanted, str(path)])
    f = tmp_path / "latin1.toml"
    f.write_bytes(b'[broker]\nhost = "\xe9"\n')
    with pytest.raises(ConfigError) as e:
        settings.load(str(f), env={})
    assert_one_line(e.value, "--config", ["not valid TOML"])


BAD_ENV = [
    ({"MQTT_BROKER_SINK__DURABILITY": "bogus"}, "sink.durability",
     ["(MQTT_BROKER_SINK__DURABILITY)", "'spool', 'async', 'none'"]),
    ({"MQTT_BROKER_PORT": "x"}, "broker.port", ["(MQTT_BROKER_PORT)", "from 0 to 65535"]),
    ({"MQTT_BROKER_MQTT__NO_SUCH_KEY": "1"}, "mqtt.no_such_key", ["unknown setting"]),
    ({"MQTT_BROKER_NOPE__X": "1"}, "nope.x", ["unknown section"]),
    ({"MQTT_BROKER_SINK__KAFKA__ACKS": "all"}, "sink.kafka.acks", ["MQTT_BROKER_<SECTION>__<KEY>"]),
    ({"MQTT_BROKER_METRICS__ENABLED": "on"}, "metrics.enabled", ["true or false"]),
]


@pytest.mark.parametrize("env,key,wanted", BAD_ENV, ids=[c[1] for c in BAD_ENV])
def test_bad_env(env, key, wanted):
    with pytest.raises(ConfigError) as e:
        settings.load(None, env=env)
    assert_one_line(e.value, key, wanted)


def test_bad_flags():
    from broker.__main__ import build_config, parse_args
    for argv, key, wanted in ((["--port", "70000"], "broker.port", ["(--port)", "to 65535"]),
                              (["--log-level", "LOUD"], "broker.log_level", ["(--log-level)"]),
                              (["--kafka-bootstrap", "k"], "sink.bootstrap_servers",
                               ["(--kafka-bootstrap)", "HOST:PORT"])):
        with pytest.raises(ConfigError) as e:
            build_config(parse_args(argv))
        assert_one_line(e.value, key, wanted)


def test_contradictory_auth():
    from broker.auth import from_config
    with pytest.raises(ConfigError) as e:
        from_config(settings.load(None, env={}, sets=["auth.allow_anonymous=false"]).auth)
    assert_one_line(e.value, "auth.allow_anonymous", ["needs auth.password_file"])


def test_bad_auth_files(tmp_path):
    from broker.auth import from_config
    acl = tmp_path / "bad.acl"
    acl.write_text("topic read ok/#\n" + "topik read x\n" * 5)
    with pytest.raises(ConfigError) as e:
        from_config({"acl_file": str(acl)})
    assert_one_line(e.value, "auth.acl_file", [f"{acl}:2: unknown directive 'topik'", "(2 more)"])
    with pytest.raises(ConfigError) as e:
        from_config({"password_file": str(tmp_path / "none")})
    assert_one_line(e.value, "auth.password_file", ["not found"])


def test_job_embedded_port_zero(tmp_path):
    from sink.history.job import load_job
    f = tmp_path / "j.toml"
    f.write_text("[sink]\nembedded_port = 0\n")
    with pytest.raises(ConfigError) as e:
        load_job(str(f))
    assert_one_line(e.value, "sink.embedded_port", ["--kafka-bootstrap"])


def test_job_jdbc_users_are_never_the_devices_logins(tmp_path):
    """The JDBC endpoint's users are operators with a password file of their own: with none
    given it does not fall back to the devices' [auth] password_file, and that file (under any
    name) is refused."""
    from broker.auth.passwords import hash_password
    from sink.history.job import UsageError, load_job
    devices = tmp_path / "passwd"
    devices.write_text("dev1:" + hash_password("d3v", n=1024) + "\n")
    (tmp_path / "alias").symlink_to(devices)
    f = tmp_path / "j.toml"
    f.write_text(f'[auth]\npassword_file = "{devices}"\n[history]\njdbc = true\n')
    with pytest.raises(UsageError, match="jdbc_password_file"):
        load_job(str(f))
    for same in (devices, tmp_path / "alias"):
        f.write_text(f'[auth]\npassword_file = "{devices}"\n[history]\njdbc = true\n'
                     f'jdbc_password_file = "{same}"\n')
        with pytest.raises(UsageError, match="devices' password file"):
            load_job(str(f))
    operators = tmp_path / "operators"
    operators.write_text("op:" + hash_password("0p", n=1024) + "\n")
    f.write_text(f'[auth]\npassword_file = "{devices}"\n[history]\njdbc = true\n'
                 f'jdbc_password_file = "{operators}"\n')
    job, _ = load_job(str(f))
    assert job.history.jdbc_password_file == str(operators)


# ---- what is valid stays valid ------------------------------------------------------------
def test_shipped_config_files_load():
    for name in ("config/broker.toml", "deploy/broker.toml"):
        cfg = settings.load(str(ROOT / name), env={})
        assert cfg.port == 1883


def test_every_documented_value_passes_as_text():
    """Each scalar in config/broker.toml, given back through --set, is accepted unchanged."""
    data = settings.read_toml(str(ROOT / "config/broker.toml"))
    items = []
    for section, table in data.items():
        for key, value in table.items():
            if isinstance(value, bool):
                items.append(f"{section}.{key}={'true' if value else 'false'}")
            elif isinstance(value, (int, float, str)):
                items.append(f"{section}.{key}={value}")
    cfg = load_set(*items)
    assert cfg.sink.durability == "spool" and cfg.mqtt.receive_maximum == 1024
    assert cfg.mqtt.connect_timeout == 10.0 and cfg.sink.enabled is False


def test_env_and_set_values_are_typed():
    cfg = settings.load(None, env={"MQTT_BROKER_MQTT__RETAIN_AVAILABLE": "FALSE",
                                 "MQTT_BROKER_SINK__TOPIC": "1234"},
                      sets=["mqtt.connect_timeout=3", "sink.forwarder_cpus=1,2"])
    assert cfg.mqtt.retain_available is False and cfg.sink.topic == "1234"
    assert cfg.mqtt.connect_timeout == 3.0 and cfg.sink.forwarder_cpus == (1, 2)


def test_schema_matches_the_modules_and_the_docs():
    """The schema is the typed tree the components read (settings/tree.py), and
    config/broker.toml documents every one of its keys."""
    from settings import AuthConfig, Config, DashboardConfig, SinkConfig
    s = sections()
    assert set(s["sink"]) == set(SinkConfig.__dataclass_fields__)
    assert set(s["dashboard"]) == set(DashboardConfig.__dataclass_fields__)
    assert set(s["auth"]) == set(AuthConfig.__dataclass_fields__)
    assert set(s) - {"broker"} | {"listeners"} == {
        name for name, f in Config.__dataclass_fields__.items() if "section" in f.metadata}
    doc = (ROOT / "config/broker.toml").read_text()
    for section, keys in s.items():
        for key in keys:
            assert re.search(rf"^[#\s]*\[?{key}\]?\s*=|^\[{section}\.{key}\]|^# \[{section}\.{key}\]",
                             doc, re.MULTILINE), f"{section}.{key} is not documented in config/broker.toml"


# ---- bounds (hypothesis): inside accepted, outside refused naming the key --------------------
BOUNDED = [(sec, key, spec) for sec, keys in sections().items() for key, spec in keys.items()
           if isinstance(spec, Num) and spec.lo is not None]


@hsettings(max_examples=300, deadline=None)
@given(st.sampled_from(BOUNDED), st.integers(-3, 3), st.booleans())
def test_bounds(case, delta, high):
    section, key, spec = case
    edge = spec.hi if high and spec.hi is not None else spec.lo
    value = edge + delta
    inside = (value > spec.lo if spec.lo_open else value >= spec.lo) and \
        (spec.hi is None or value <= spec.hi)
    text = f"{section}.{key}={value}"
    if inside:
        load_set(text)
    else:
        with pytest.raises(ConfigError) as e:
            load_set(text)
        assert_one_line(e.value, f"{section}.{key}", [spec.allowed])
