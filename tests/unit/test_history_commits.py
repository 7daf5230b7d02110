"""What the history job reports as committed (sink/history/commits.py contract), from query progress and
from the checkpoint; no Spark or Kafka needed."""
from __future__ import annotations

import json

from sink.history.commits import committed_path, is_committed, read_committed, write_committed
from sink.history.job import committed_from_checkpoint, committed_offsets


def test_python_source_offsets_carry_topic_ids():
    end = {"t": {"mqtt.messages": {"0": 120, "1": 7}, "mqtt.s": {"0": 3}},
           "ids": {"mqtt.messages": "id-1", "mqtt.s": ""}, "ts": 1763800000000}
    for value in (end, json.dumps(end)):  # progress JSON gives a string or a parsed dict
        assert committed_offsets([value]) == {
            "mqtt.messages": {"topic_id": "id-1", "offsets": {0: 120, 1: 7}},
            "mqtt.s": {"topic_id": None, "offsets": {0: 3}}}  # "" = unknown


def test_native_connector_offsets_have_no_topic_id():
    assert committed_offsets(['{"mqtt.messages":{"0":42,"1":0}}']) == {
        "mqtt.messages": {"topic_id": None, "offsets": {0: 42, 1: 0}}}


def test_nothing_usable_reports_nothing():
    assert committed_offsets([None, "", "not json", 5, {"t": {"a": "x"}}]) == {}


def test_last_commit_from_checkpoint(tmp_path):
    ckpt = tmp_path / "history_checkpoint"
    assert committed_from_checkpoint(str(ckpt)) is None  # no checkpoint yet
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "commits").mkdir()
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'
    for n, off in ((0, 10), (1, 25), (2, 40)):
        (ckpt / "offsets" / str(n)).write_text(
            f'v1\n{meta}\n{{"t":{{"m":{{"0":{off}}}}},"ids":{{"m":"tid"}}}}\n')
    (ckpt / "commits" / "0").write_text("v1\n{}\n")
    (ckpt / "commits" / "1").write_text("v1\n{}\n")
    (ckpt / "commits" / ".1.crc").write_text("")
    # batch 2 is planned (offsets/2) but not committed: its records are not in the table
    assert committed_from_checkpoint(str(ckpt)) == (1, {"m": {"topic_id": "tid",
                                                              "offsets": {0: 25}}})


def test_written_file_answers_the_spool(tmp_path):
    table = str(tmp_path / "history")
    path = committed_path(table)
    write_committed(path, 4, committed_offsets([{"t": {"m": {"0": 25}}, "ids": {"m": "tid"}}]))
    state = read_committed(path)
    assert state["batch_id"] == 4
    assert is_committed(state, "m", "tid", 0, 24) and not is_committed(state, "m", "tid", 0, 25)
    assert not is_committed(state, "m", "other-incarnation", 0, 0)


def test_job_says_when_its_table_flag_hides_its_commits_from_the_broker(tmp_path):
    """The broker looks for the committed file where the config's [history] says; a job started
    with --table/--checkpoint elsewhere says so at once (with keep_until = "history" the spool
    would keep every record until spool_max_bytes)."""
    from sink.history.job import config_from_args
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'[sink]\nkeep_until = "history"\n[history]\ntable = "{tmp_path}/history"\n')
    _, args = config_from_args(["--config", str(cfg)])
    assert args.notes == []
    _, args = config_from_args(["--config", str(cfg), "--table", str(tmp_path / "history")])
    assert args.notes == []                                  # the same place, given twice
    _, args = config_from_args(["--config", str(cfg), "--table", str(tmp_path / "other")])
    [note] = args.notes
    assert f"{tmp_path}/history_checkpoint/history_committed.json" in note
    assert "keeps every record until spool_max_bytes" in note
    _, args = config_from_args(["--config", str(cfg), "--checkpoint", str(tmp_path / "ck")])
    assert len(args.notes) == 1 and "--checkpoint" in args.notes[0]
    cfg.write_text(f'[history]\ntable = "{tmp_path}/history"\n')       # keep_until = "kafka"
    _, args = config_from_args(["--config", str(cfg), "--table", str(tmp_path / "other")])
    assert args.notes == []                                  # the broker does not wait for it
