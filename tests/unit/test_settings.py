"""The typed configuration tree (settings/): every documented key is one field with one default,
valid values round-trip through the tree, components read sections (not dicts with defaults),
and the package is a leaf both the broker and the history job import."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import MISSING
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import settings
from settings import Config, ConfigError, ListenerConfig, SinkConfig, load, rules, sections
from settings.checks import (
    Bool,
    Check,
    Enum,
    HistoryRules,
    HostPorts,
    IntList,
    Num,
    Pattern,
    Rule,
    Rules,
    Str,
    StrList,
    Table,
    connect_address,
    duration_ms,
)
from settings.load import apply_file
from settings.tree import SECTIONS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "config/broker.toml"


def section_classes() -> dict:
    return {"broker": Config, **SECTIONS, "listeners": ListenerConfig}


def keys_of(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if "section" not in f.metadata]


# ---- every key in config/broker.toml: exactly one typed field with one default -------------
def documented_keys() -> dict[str, dict[str, object]]:
    """{section: {key: value or None (documented only in a comment)}} of config/broker.toml."""
    data = tomllib.loads(DOC.read_text())
    out = {name: dict(table) for name, table in data.items()}
    section = None
    for line in DOC.read_text().splitlines():
        m = re.match(r"^#?\s*\[\[?([a-z_.]+)\]?\]", line)
        if m:
            section = m.group(1)
            top, _, sub = section.partition(".")
            if sub:  # [sink.kafka], [history.kafka]: a table-valued key
                out.setdefault(top, {}).setdefault(sub, None)
            continue
        m = re.match(r"^#\s*([a-z_]+)\s*=", line)   # a key documented in a comment
        if m and section:
            top, _, sub = section.partition(".")
            if not sub:  # [history.kafka] / [sink.kafka] comments are Kafka's own names
                out.setdefault(top, {}).setdefault(m.group(1), None)
    return out


def test_every_documented_key_is_one_field_with_one_default():
    classes = section_classes()
    doc = documented_keys()
    assert set(doc) == set(classes), "a section of config/broker.toml has no typed section"
    for name, table in doc.items():
        cls = classes[name]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in table.items():
            assert key in fields, f"{name}.{key} is documented but not a field of {cls.__name__}"
            f = fields[key]
            # one default: either a value or a factory, never none and never both
            assert (f.default is MISSING) != (f.default_factory is MISSING), f"{name}.{key}"
            if value is None or name == "listeners":
                continue
            # the documented value is the default (as the loader types it)
            default = getattr(cls(), key)
            assert sections()[name][key].check(value, False) == default, \
                f"{name}.{key}: config/broker.toml says {value!r}, the tree's default is {default!r}"
        # and the other way round: every field is documented
        assert set(keys_of(cls)) == set(table), f"[{name}] keys not documented: " \
            f"{set(keys_of(cls)) - set(table)}"


def test_checks_are_the_trees():
    """The check table is derived from the tree: one Spec per field, nothing else."""
    for name, cls in section_classes().items():
        if name == "listeners":
            assert set(cls.specs()) == set(keys_of(cls))
            continue
        assert sections()[name] == cls.specs()
        assert list(sections()[name]) == keys_of(cls)
        for f in dataclasses.fields(cls):
            if "check" in f.metadata:
                assert sections()[name][f.name] is f.metadata["check"]


def test_defaults_are_typed_and_valid():
    """Each default passes its own check unchanged (the tree's default is a legal setting)."""
    for name, cls in section_classes().items():
        obj = cls()
        for key, spec in cls.specs().items():
            value = getattr(obj, key)
            if value is None:   # optional keys: auth.allow_anonymous, a listener's port
                continue
            shown = [r._asdict() for r in value] if isinstance(spec, Rules) else \
                list(value) if isinstance(value, tuple) else value
            assert spec.check(shown, False) == value, f"{name}.{key}"


def test_sections_are_slotted():
    for cls in section_classes().values():
        with pytest.raises(AttributeError):
            cls().no_such_setting = 1


# ---- valid values round-trip through the tree (hypothesis) ----------------------------------
HOST = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}", fullmatch=True)
TEXT = st.text(max_size=20)


def valid(spec):
    """(strategy of valid file values, function giving the typed value the tree must hold)."""
    def same(v):
        return v
    if isinstance(spec, Bool):
        return st.booleans(), same
    if isinstance(spec, Num):
        hi = spec.hi if spec.hi is not None else 1e12
        if spec.whole:
            return st.integers(spec.lo, int(hi)), same
        return st.one_of(st.floats(spec.lo, hi, exclude_min=spec.lo_open, allow_nan=False),
                         st.integers(int(spec.lo) + 1, int(hi))), float
    if isinstance(spec, Enum):
        if spec.any_case:
            return st.sampled_from(spec.choices).map(str.lower) | st.sampled_from(spec.choices), \
                str.upper
        return st.sampled_from(spec.choices), same
    if isinstance(spec, Pattern):
        return st.from_regex(spec.regex, fullmatch=True), same
    if isinstance(spec, Check):
        if spec.fn is connect_address:
            return st.just("") | st.builds("sc://{}:{}".format, HOST, st.integers(0, 65535)), same
        if spec.fn is duration_ms:
            return st.just("") | st.builds("{}{}".format, st.integers(1, 10_000),
                                           st.sampled_from(["d", "h", " days", "w"])), same
        return st.sampled_from(["earliest", "latest", '{"t": {"0": 5}}']), same
    if isinstance(spec, Str):
        return TEXT, same
    if isinstance(spec, StrList):
        return st.lists(TEXT, max_size=4), tuple
    if isinstance(spec, IntList):
        return st.lists(st.integers(0, 4096), max_size=4), tuple
    if isinstance(spec, HostPorts):
        hp = st.builds("{}:{}".format, HOST, st.integers(1, 65535))
        return st.lists(hp, max_size=3), ",".join
    if isinstance(spec, Rules):
        rule = st.fixed_dictionaries({"filter": TEXT.filter(bool), "topic": TEXT.filter(bool)})
        return st.lists(rule, max_size=3), lambda v: tuple(Rule(r["filter"], r["topic"]) for r in v)
    if isinstance(spec, HistoryRules):
        name = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
        rule = st.fixed_dictionaries({"name": name, "sql": st.just("SELECT topic FROM messages"),
                                      "publish": st.just("out/t")})
        return (st.lists(rule, max_size=3, unique_by=lambda r: r["name"]),
                lambda v: tuple(rules.check(r, rules.CONFIG) for r in v))
    if isinstance(spec, Table):
        return st.dictionaries(TEXT.filter(bool), st.integers() | TEXT | st.booleans(),
                               max_size=3), same
    raise AssertionError(f"no strategy for {spec!r}")


KEYS = [(name, key, spec) for name, specs in sections().items() for key, spec in specs.items()]


@st.composite
def config_files(draw):
    """A config file (as the dict tomllib gives) setting some keys, and the tree it must give."""
    data: dict = {}
    want = []
    for name, key, spec in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=12,
                                         unique_by=lambda c: c[:2])):
        strategy, typed = valid(spec)
        value = draw(strategy)
        data.setdefault(name, {})[key] = value
        want.append((name, key, typed(value)))
    return data, want


def section_of(cfg: Config, name: str):
    return cfg if name == "broker" else getattr(cfg, name)


def written_out(cfg: Config) -> dict:
    """The config file (as a dict) of a tree: each section's Section.to_table, the form the
    broker hands the [sink] section to its forwarder in."""
    out = {"broker": cfg.to_table(), **{name: getattr(cfg, name).to_table() for name in SECTIONS}}
    out["listeners"] = [x.to_table() for x in cfg.listeners]
    return out


@hsettings(max_examples=300, deadline=None)
@given(config_files())
def test_valid_values_round_trip(case):
    data, want = case
    cfg = Config()
    apply_file(cfg, data, "t.toml")
    for name, key, typed in want:
        got = getattr(section_of(cfg, name), key)
        assert got == typed and type(got) is type(typed), (name, key, got, typed)
    again = Config()
    apply_file(again, written_out(cfg), "again.toml")   # the tree, written out and read back
    assert again == cfg


SCALARS = [(n, k, s) for n, k, s in KEYS if isinstance(s, (Bool, Num, Str, Enum))]


@hsettings(max_examples=300, deadline=None)
@given(st.sampled_from(SCALARS).flatmap(
    lambda c: valid(c[2])[0].map(lambda v: (c, v))))
def test_scalar_values_round_trip_as_text(case):
    """--set / MQTT_BROKER_* give text: the same field value as the file's typed value."""
    (name, key, spec), value = case
    typed = valid(spec)[1]
    text = ("true" if value else "false") if isinstance(value, bool) else \
        repr(value) if isinstance(value, float) else str(value)
    via_set = load(None, env={}, sets=[f"{name}.{key}={text}"])
    via_env = load(None, env={("MQTT_BROKER_" + key if name == "broker" else
                               f"MQTT_BROKER_{name}__{key}").upper(): text})
    for cfg in (via_set, via_env):
        assert getattr(section_of(cfg, name), key) == typed(value)


def test_lists_from_text():
    cfg = load(None, env={"MQTT_BROKER_SINK__EXCLUDE": "$SYS/#, debug/#"},
               sets=["history.kafka_topics=a,b", "sink.bootstrap_servers= k1:9092 ,k2:9093"])
    assert cfg.sink.exclude == ("$SYS/#", "debug/#")
    assert cfg.history.kafka_topics == ("a", "b")
    assert cfg.sink.bootstrap_servers == "k1:9092,k2:9093"


# ---- components take their section ----------------------------------------------------------
def test_sink_takes_its_section(tmp_path):
    """spool_max_bytes has one default (the tree's), which reaches the forwarder's config; a
    [sink] dict is checked like the file (an unknown key is an error, no longer a warning)."""
    from sink.forward.service import Sink
    s = Sink({}, str(tmp_path))
    assert s.max_bytes == SinkConfig().spool_max_bytes == 1 << 30
    assert s.cfg.spool_dir == str(tmp_path / "spool")
    from sink.forward.forwarder import decode_setup, encode_setup
    sink = SinkConfig(spool_max_bytes=12345, forwarder_cpus=(0,), forwarders=2,
                      rules=(settings.Rule("a/#", "ka"),), kafka={"linger_ms": 5})
    s = Sink(sink, str(tmp_path))
    s.key = b"k" * 32
    section, rt = decode_setup(encode_setup(s.cfg, s.runtime(shard=1)))
    assert section == s.cfg and section.spool_max_bytes == 12345   # the same section, as the tree
    assert section.forwarder_cpus == (0,) and section.rules == (("a/#", "ka"),)  # serializes it
    assert (rt.spool_dir, rt.data_dir, rt.sink_key, rt.shard, rt.shards) == \
        (str(tmp_path / "spool"), str(tmp_path), b"k" * 32, 1, 2)
    from sink.history import commits  # the status file of the job writing [history] table
    assert rt.job_file == commits.job_file(str(tmp_path), settings.HistoryConfig().table)
    with pytest.raises(ConfigError, match=r"sink\.spool_max_byte = 1.*did you mean sink\.spool_max_bytes"):
        Sink({"spool_max_byte": 1}, str(tmp_path))
    with pytest.raises(ConfigError, match="sink.durability"):
        Sink({"durability": "fast"}, str(tmp_path))


def test_job_reads_the_tree(tmp_path):
    """The job takes the [history] section as the tree loaded it, Kafka from [sink]."""
    from sink.history.job import config_from_args, load_job
    f = tmp_path / "j.toml"
    f.write_text('[sink]\nbootstrap_servers = ["k1:9092", "k2:9092"]\ntopic = "m"\n'
                 'rules = [{ filter = "a/#", topic = "ka" }, { filter = "b/#", topic = "m" }]\n'
                 '[history]\nmax_records_per_trigger = 0\ntrigger_seconds = 2\n')
    job, notes = load_job(str(f))
    assert job.bootstrap == "k1:9092,k2:9092" and job.topics == ["m", "ka"] and notes == []
    assert not job.embedded_kafka
    assert isinstance(job.history, settings.HistoryConfig)
    assert job.history == settings.load(str(f), env={}).history    # the section itself
    assert "maxOffsetsPerTrigger" not in job.kafka_options()         # 0: no cap
    job, _ = config_from_args([])                        # no file: the tree's defaults
    assert job.history == settings.HistoryConfig()
    assert job.topics == [SinkConfig().topic] and job.embedded_kafka
    assert job.bootstrap == f"127.0.0.1:{SinkConfig().embedded_port}"


def test_query_defaults_are_the_trees():
    from sink.history import query
    assert query.DEFAULT_CONNECT_URL == settings.HistoryConfig().connect_url == \
        "sc://127.0.0.1:15002"
    assert query.DEFAULT_TABLE == settings.HistoryConfig().table


def test_listeners_are_typed():
    cfg = Config(port=1, listeners=[{"type": "ws", "port": 2}])
    specs = settings.listener_specs(cfg)
    assert [(s.type, s.host, s.port, s.name, s.path) for s in specs] == [
        ("tcp", "127.0.0.1", 1, "mqtt", "/mqtt"), ("ws", "127.0.0.1", 2, "ws0", "/mqtt")]


CONFIG_KEYS = sorted({key for specs in sections().values() for key in specs}
                     | set(ListenerConfig.specs()), key=len, reverse=True)
READERS = ["broker/__main__.py", "broker/server.py", "broker/transport/tls.py",
           "broker/transport/websocket.py", "broker/auth/__init__.py",
           "broker/dashboard/__init__.py", "broker/dashboard/api.py", "sink/forward/service.py",
           "sink/history/query.py", "sink/history/job/config.py", "sink/history/job/connect.py",
           "sink/history/job/stream.py", "sink/history/job/report.py", "sink/history/job/command.py"]


@pytest.mark.parametrize("path", READERS)
def test_components_do_not_read_settings_from_dicts(path):
    """No component reads a setting as dict.get("key", default): a second default."""
    text = (ROOT / path).read_text()
    pattern = re.compile(r"""\.get\(\s*["'](""" + "|".join(CONFIG_KEYS) + r""")["']""")
    assert not pattern.findall(text), f"{path}: {pattern.findall(text)}"


def test_settings_is_a_leaf_and_the_job_does_not_import_the_broker():
    code = ("import sys; import settings, sink.job, sink.query; "
            "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
            "('broker', 'sink', 'settings')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert "broker" not in out.stdout, out.stdout
    code = ("import sys; before = set(sys.modules); import settings; "
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}"
            " - set(sys.stdlib_module_names) - {'settings'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stdout


def test_component_defaults_agree_with_the_tree():
    """Constructors that components also use without a config (tests, benches) keep keyword
    defaults; each is the tree's default for the key it stands for, never a second value."""
    import inspect

    from broker.auth import AccessControl
    from broker.auth.checks import CheckQueue
    from broker.observability.sys_topics import SysPublisher
    from broker.store.sqlite import Store
    from sink.forward.forwarder import Forwarder
    from sink.forward.spool import SpoolWriter

    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    sink, persistence, auth = SinkConfig(), settings.PersistenceConfig(), settings.AuthConfig()
    pairs = [
        (default(Store.__init__, "synchronous"), persistence.synchronous),
        (default(Store.__init__, "max_pending"), persistence.max_pending_changes),
        (default(SysPublisher.__init__, "interval"), settings.MetricsConfig().sys_interval),
        (default(SpoolWriter.__init__, "segment_bytes"), sink.spool_segment_bytes),
        (default(CheckQueue.__init__, "max_pending"), auth.max_pending_checks),
        (default(CheckQueue.__init__, "threads"), auth.check_threads),
    ] + [(default(AccessControl.__init__, k), getattr(auth, k))
         for k in ("cache_seconds", "reload_interval", "decision_cache_size", "client_id_pattern",
                   "allow_anonymous")]
    for i, (got, want) in enumerate(pairs):
        assert got == want, f"pair {i}: {got!r} != the tree's {want!r}"
    # the forwarder takes its [sink] section itself: no parameter of its own for one of its keys
    assert not set(inspect.signature(Forwarder.__init__).parameters) & set(SinkConfig.specs())


def test_job_flags_set_the_keys_of_the_tree(tmp_path):
    """Each of sink.job's flags sets one key of the tree and is checked as that key (the
    ConfigError names the flag); what no flag sets stays as the file says."""
    from sink.history.job import FLAG_KEYS, config_from_args
    f = tmp_path / "j.toml"
    f.write_text('[history]\ndedup_window = "2 hours"\n')
    job, _ = config_from_args(["--config", str(f), "--table", "/t", "--checkpoint", "/c",
                               "--trigger-seconds", "3", "--source", "python", "--nice", "4",
                               "--connect-port", "16000", "--no-connect", "--no-verify-records",
                               "--kafka-topic", "a,b", "--kafka-topic", "c",
                               "--kafka-bootstrap", "k:1", "--data-dir", "/d"])
    h = job.history
    assert (h.table, h.checkpoint, h.trigger_seconds, h.source, h.nice, h.connect_port,
            h.connect, h.verify_records, h.dedup_window) == \
        ("/t", "/c", 3.0, "python", 4, 16000, False, False, "2 hours")
    assert (job.topics, job.bootstrap, job.data_dir, job.embedded_kafka) == \
        (["a", "b", "c"], "k:1", "/d", False)
    for section, key in FLAG_KEYS.values():
        assert key in sections()[section]
    for argv, key in ((["--trigger-seconds", "0"], "history.trigger_seconds"),
                      (["--connect-port", "0"], "history.connect_port"),
                      (["--kafka-bootstrap", "nohost"], "sink.bootstrap_servers")):
        with pytest.raises(ConfigError, match=rf"{key} = .*\(--{argv[0][2:]}\)"):
            config_from_args(argv)


def test_job_niceness_from_config_and_flag(tmp_path):
    """[history] nice (default 10), overridden by --nice; checked 0-19."""
    from sink.history.job import config_from_args
    assert config_from_args([])[0].history.nice == settings.HistoryConfig().nice == 10
    f = tmp_path / "j.toml"
    f.write_text("[history]\nnice = 3\n")
    assert config_from_args(["--config", str(f)])[0].history.nice == 3
    assert config_from_args(["--config", str(f), "--nice", "0"])[0].history.nice == 0
    with pytest.raises(ConfigError, match=r"history.nice = 25 \(--nice\): must be a whole number from 0 to 19"):
        config_from_args(["--nice", "25"])


def test_job_lowers_its_priority_and_children_inherit_it():
    """lower_priority(n) sets the process's niceness (the JVM and Python workers it starts
    inherit it) and never raises it back."""
    code = ("import os, subprocess, sys; from sink.history.job import lower_priority; "
            "lower_priority(7); lower_priority(3); "
            "print(os.getpriority(os.PRIO_PROCESS, 0), subprocess.check_output("
            "[sys.executable, '-c', 'import os; print(os.getpriority(os.PRIO_PROCESS, 0))']).decode().strip())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout.split() == ["7", "7"]


def test_job_leading_its_session_lowers_its_autogroup_too():
    """With autogroup scheduling the CPU is shared between sessions before niceness applies: a
    job in its own session (setsid) lowers its autogroup's niceness, one sharing a session
    leaves the autogroup (its neighbours', e.g. the broker's) alone."""
    from pathlib import Path
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("this kernel has no autogroup scheduling (/proc/self/autogroup): nothing to lower")
    # The file reads "/autogroup-N nice K", or nothing at all in the kernel's default autogroup
    # (init's session, as under some CI runners): `nice` prints K, or "-" for nothing.
    nice = "(open('/proc/self/autogroup').read().split() or ['-'])[-1]"
    probe = (f"import os; os.setsid(); n = {nice}; "
             "open('/proc/self/autogroup', 'w').write(n)")  # the same value: may we write at all?
    probed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if probed.returncode and "Errno 11" not in probed.stderr:  # EAGAIN: writable, rate-limited
        pytest.skip("/proc/self/autogroup is read-only here (e.g. a container's /proc): the job "
                    f"logs a warning and keeps its process niceness ({probed.stderr.strip()[-200:]})")
    code = f"from sink.history.job import lower_priority; lower_priority(9); print({nice})"
    # the probe's write just used the kernel's one-write-per-100-ms allowance (without
    # CAP_SYS_ADMIN): lower_priority must wait for the next one, not give up
    own = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, start_new_session=True)
    assert own.returncode == 0, own.stderr
    assert own.stdout.split() == ["9"], own.stderr
    # sharing this session: its autogroup (or the default one, which shows nothing) is untouched
    shared = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert shared.returncode == 0, shared.stderr
    mine = (Path("/proc/self/autogroup").read_text().split() or ["-"])[-1]
    assert shared.stdout.split() == [mine], shared.stderr


def test_autogroup_write_retries_the_kernels_rate_limit(tmp_path, monkeypatch):
    """Without CAP_SYS_ADMIN the kernel takes one autogroup niceness write per 100 ms on the
    whole machine and answers EAGAIN to others: set_autogroup_nice waits and retries, and gives
    up (returning False, logging why) only after its attempts."""
    from sink.history.job import process as job
    target = tmp_path / "autogroup"
    target.write_text("")
    monkeypatch.setattr(job, "AUTOGROUP", str(target))
    monkeypatch.setattr(job.time, "sleep", lambda s: None)
    real_write, refusals = os.write, [2]

    def write(fd, data):
        if refusals[0] and os.readlink(f"/proc/self/fd/{fd}") == str(target):
            refusals[0] -= 1
            raise BlockingIOError(11, "write could not complete without blocking")
        return real_write(fd, data)
    monkeypatch.setattr(job.os, "write", write)
    assert job.set_autogroup_nice(9) is True
    assert target.read_text() == "9"
    refusals[0] = 100
    assert job.set_autogroup_nice(8, attempts=3) is False
    assert refusals[0] == 97 and target.read_text() == "9"


def test_job_in_the_default_autogroup_leaves_it_alone(tmp_path, monkeypatch, caplog):
    """In the kernel's default autogroup (init's session, as under some CI runners and
    supervisors) /proc/self/autogroup reads empty: lower_priority neither fails nor writes."""
    from sink.history.job import process as job
    target = tmp_path / "autogroup"
    target.write_text("")
    monkeypatch.setattr(job, "AUTOGROUP", str(target))
    monkeypatch.setattr(job.os, "getsid", lambda pid: os.getpid())  # as the session's leader
    monkeypatch.setattr(job.os, "setpriority", lambda *a: None)
    writes = []
    monkeypatch.setattr(job, "set_autogroup_nice", lambda n, attempts=10: writes.append(n))
    with caplog.at_level("WARNING", logger="sink.history.job.process"):
        job.lower_priority(9)
    assert writes == [] and not caplog.records
    target.write_text("/autogroup-7 nice 0\n")
    job.lower_priority(9)
    assert writes == [9]
