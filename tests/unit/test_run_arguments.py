"""One tree for every part of a run (settings/parts.py): the broker and the history job take the
same arguments and environment (scripts/run.sh gives both the same), build the same tree, and
refuse a setting given on the command line that nothing they run reads, naming the part that
would. The job's status file in the data directory is one per table."""
from __future__ import annotations

import json
import os

import pytest

from settings import ConfigError
from sink.history import commits

RUN_ARGS = ["--config", "config/broker.toml", "--sink", "--set", "sink.keep_until=history",
            "--set", "dashboard.enabled=true", "--set", "dashboard.port=18099"]


def broker_tree(argv):
    from broker.__main__ import build_config, parse_args
    return build_config(parse_args(argv))


def job_of(argv):
    from sink.history.job import config_from_args
    return config_from_args(argv)


@pytest.fixture(autouse=True)
def _root(monkeypatch):
    from tests.conftest import ROOT
    monkeypatch.chdir(ROOT)
    for var in [v for v in os.environ if v.startswith("MQTT_BROKER_")]:
        monkeypatch.delenv(var)


def test_the_job_reads_the_same_data_dir_set_and_environment_as_the_broker(tmp_path, monkeypatch):
    """`run.sh --data-dir D --set history.table=T` with MQTT_BROKER_HISTORY__TRIGGER_SECONDS in
    the environment: the job's data directory (its secrets: the key records are signed with),
    table and trigger are the broker's, not ./data and the defaults."""
    monkeypatch.setenv("MQTT_BROKER_HISTORY__TRIGGER_SECONDS", "2.5")
    argv = [*RUN_ARGS, "--data-dir", str(tmp_path / "d"), "--set", f"history.table={tmp_path}/t",
            "--port", "18830", "--host", "127.0.0.1", "--log-format", "json"]
    cfg = broker_tree([*argv, "--with-job"])
    job, _ = job_of([*argv, "--with-broker"])
    assert job.data_dir == cfg.data_dir == str(tmp_path / "d")
    assert job.history == cfg.history
    assert job.history.table == f"{tmp_path}/t" and job.history.trigger_seconds == 2.5


def test_a_setting_only_the_job_reads_is_refused_by_a_broker_started_alone():
    """`python -m broker --set history.jdbc=true` reached nothing (the job was not given it):
    now it is refused, naming the history job; beside the job (run.sh) it is accepted."""
    with pytest.raises(ConfigError, match=r"history.jdbc = true \(--set\): not used by this "
                                          r"broker: it is read by the history job \(python -m sink.job\)"):
        broker_tree(["--set", "history.jdbc=true"])
    assert broker_tree(["--set", "history.jdbc=true", "--with-job"]).history.jdbc is True


def test_a_broker_flag_is_refused_by_a_job_started_alone_and_accepted_beside_the_broker():
    with pytest.raises(ConfigError, match=r"broker.port = 1884 \(--port\): not used by the "
                                          r"history job: it is read by the broker"):
        job_of(["--port", "1884"])
    job, _ = job_of(["--port", "1884", "--host", "0.0.0.0", "--sink", "--log-format", "json",
                     "--with-broker"])
    assert job.history.table == "./data/history"


def test_a_setting_of_a_part_that_is_off_is_refused_naming_it():
    """The dashboard's port with the dashboard off (run.sh with DASHBOARD=0) reaches nothing."""
    with pytest.raises(ConfigError, match=r"dashboard.port = 18099 \(--set\): not used: it is "
                                          r"read by the dashboard .*which is off here"):
        broker_tree(["--set", "dashboard.port=18099", "--with-job"])
    with pytest.raises(ConfigError, match="read by the cluster mode"):
        broker_tree(["--set", "cluster.node_id=n1"])
    with pytest.raises(ConfigError, match="read by history replay"):
        broker_tree(["--set", "replay.max_replays=3"])       # no sink: no replay
    assert broker_tree(["--sink", "--set", "replay.max_replays=3"]).replay.max_replays == 3
    assert broker_tree(RUN_ARGS).dashboard.port == 18099


def test_switching_off_a_part_that_does_not_run_is_not_refused():
    assert broker_tree(["--set", "replay.enabled=false", "--set", "cluster.enabled=false",
                        "--no-sink"]).replay.enabled is False
    assert job_of(["--no-sink", "--set", "dashboard.enabled=false"])[0].history.connect


def test_keys_two_parts_read_are_accepted_by_either():
    """[sink] bootstrap_servers is where the broker forwards and the job reads; [history] table
    is where the job writes and the broker finds its commits."""
    assert job_of(["--kafka-bootstrap", "k:9092"])[0].bootstrap == "k:9092"
    assert job_of(["--set", "sink.topic=t"])[0].topics == ["t"]
    assert broker_tree(["--sink", "--set", "history.table=/t"]).history.table == "/t"


def test_the_job_log_level_follows_the_tree_unless_given(monkeypatch):
    monkeypatch.delenv("SINK_LOG_LEVEL", raising=False)
    assert job_of([])[1].log_level == "INFO"
    assert job_of(["--set", "broker.log_level=WARNING"])[1].log_level == "WARNING"
    monkeypatch.setenv("SINK_LOG_LEVEL", "DEBUG")
    assert job_of(["--set", "broker.log_level=WARNING"])[1].log_level == "DEBUG"
    assert job_of(["--log-level", "ERROR"])[1].log_level == "ERROR"


def test_the_broker_and_the_job_check_config_say_one_line_and_exit_2(capsys):
    from broker.__main__ import main as broker_main
    from sink.history.job import main as job_main
    assert broker_main(["--set", "history.nice=3", "--check-config"]) == 2
    assert job_main(["--set", "mqtt.maximum_qos=1", "--check-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "history.nice" in err[0] and "the history job" in err[0]
    assert "mqtt.maximum_qos" in err[1] and "read by the broker" in err[1]
    assert job_main(["--set", "mqtt.maximum_qos=1", "--with-broker", "--check-config"]) == 0


# ---- the job's status file ----------------------------------------------------------------------

def announce(data_dir, table, pid=None):
    path = commits.job_file(str(data_dir), table)
    with open(path, "w") as f:
        json.dump({"pid": pid or os.getpid(), "started_at": 1.0, "table": table,
                   "committed_file": commits.committed_path(table)}, f)
    return path


def test_two_jobs_on_one_data_directory_keep_a_status_file_each(tmp_path):
    """Two jobs on one data directory overwrote each other's history_job.json, and a broker
    waited for the wrong table: each table has its own file, each reader finds its own."""
    a, b = str(tmp_path / "a" / "history"), str(tmp_path / "b" / "history")
    fa, fb = announce(tmp_path, a), announce(tmp_path, b)
    assert fa != fb and os.path.basename(fa).startswith("history_job.history-")
    assert commits.running_job(fa)["table"] == a
    assert commits.running_job(fb)["table"] == b
    from sink.history.query import running_job  # sink.query: the one of its table
    assert running_job(str(tmp_path), table=a)["table"] == a
    assert running_job(str(tmp_path), table=b)["table"] == b


def test_sink_query_waits_for_the_job_serving_its_address(tmp_path):
    """Two jobs on one data directory, each serving Spark Connect on its own port: sink.query
    waits for the one at the address it asks, whatever table its config names."""
    from sink.history.query import running_job
    for name, port in (("a", 15101), ("b", 15102)):
        path = announce(tmp_path, str(tmp_path / name / "history"))
        info = json.loads(open(path).read())
        info["serves_connect_at"] = f"sc://127.0.0.1:{port}"
        with open(path, "w") as f:
            json.dump(info, f)
    for name, port in (("a", 15101), ("b", 15102)):
        found = running_job(str(tmp_path), f"sc://127.0.0.1:{port}", "./elsewhere")
        assert found["table"] == str(tmp_path / name / "history")


def test_the_job_announces_itself_in_its_tables_status_file(tmp_path):
    from sink.history.job import Job
    from sink.history.job import announce as job_announce
    job = Job.of(table=str(tmp_path / "t"), data_dir=str(tmp_path / "d"))
    job_announce(job)
    info = json.loads(open(commits.job_file(str(tmp_path / "d"), str(tmp_path / "t"))).read())
    assert info["pid"] == os.getpid() and info["table"] == str(tmp_path / "t")
    assert not (tmp_path / "d" / commits.JOB_FILE).exists()


def test_a_broker_finds_a_job_of_another_table_and_the_file_of_before(tmp_path):
    """No job of its own table: the running job of another one (the broker then names it), or
    one that wrote history_job.json as before."""
    mine = commits.job_file(str(tmp_path), str(tmp_path / "mine"))
    assert commits.running_job(mine) is None
    announce(tmp_path, str(tmp_path / "other"))
    assert commits.running_job(mine)["table"] == str(tmp_path / "other")
    assert commits.running_job(mine, others=False) is None
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / commits.JOB_FILE).write_text(json.dumps(
        {"pid": os.getpid(), "table": "/x", "committed_file": "/x_checkpoint/c.json"}))
    assert commits.running_job(commits.job_file(str(legacy), "/x"))["table"] == "/x"


def test_the_forwarder_reads_the_status_file_of_its_table(tmp_path):
    from settings import HistoryConfig, SinkConfig
    from sink.forward.service import Sink
    s = Sink(SinkConfig(keep_until="history"), str(tmp_path), HistoryConfig(table="/srv/h"))
    assert s.runtime().job_file == commits.job_file(str(tmp_path), "/srv/h")
