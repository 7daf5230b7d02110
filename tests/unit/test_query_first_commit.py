"""sink.query before the history job's first commit says so, with how long the job has run,
rather than printing an empty answer as if the history were empty."""
from __future__ import annotations

from sink.history.query import first_commit_note, job_committed


def test_a_job_without_its_commits_file_has_not_committed(tmp_path):
    job = {"pid": 4242, "started_at": 1000.0, "committed_file": str(tmp_path / "c.json")}
    assert not job_committed(job)
    (tmp_path / "c.json").write_text("{}")
    assert job_committed(job)


def test_the_note_names_the_job_and_how_long_it_has_run():
    note = first_commit_note({"pid": 4242, "started_at": 1000.0}, now=1012.4)
    assert "pid 4242" in note and "started 12 s ago" in note
    assert "not committed its first micro-batch yet" in note


def test_a_job_that_names_no_commits_file_is_not_doubted():
    assert job_committed({"pid": 1})
