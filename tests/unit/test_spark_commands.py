"""Spark's commands in .venv/bin (beeline, spark-sql, spark-submit, pyspark) run without the venv
activated: scripts/setup.sh installs scripts/spark_command.sh under their names, which sets
SPARK_HOME to the venv's PySpark and finds Java. pip's own scripts ran `python3` from PATH to find
Spark and, outside the venv, printed "Could not find valid SPARK_HOME"."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
COMMANDS = ("beeline", "spark-sql", "spark-submit", "pyspark")
BARE = {"PATH": "/usr/bin:/bin"}      # env -i PATH=/usr/bin:/bin: no venv, no SPARK_HOME, no JAVA_HOME


def test_setup_installs_the_launcher_as_each_command():
    for name in COMMANDS:
        installed = VENV_BIN / name
        assert installed.read_bytes() == (ROOT / "scripts/spark_command.sh").read_bytes(), \
            f"{installed} is not scripts/spark_command.sh: run scripts/setup.sh"


def test_beeline_starts_with_an_empty_environment():
    """`.venv/bin/beeline --help` with nothing but PATH set: Beeline's own usage, exit 0."""
    done = subprocess.run([str(VENV_BIN / "beeline"), "--help"], env=BARE, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-2000:]
    assert "Usage: java org.apache.hive.cli.beeline.BeeLine" in said
    assert "SPARK_HOME" not in said


def fake_venv(tmp_path: Path) -> Path:
    """A venv's layout with the launcher as bin/beeline and a PySpark whose beeline prints what
    it was given."""
    bin_ = tmp_path / "venv/bin"
    spark = tmp_path / "venv/lib/python3.11/site-packages/pyspark/bin"
    bin_.mkdir(parents=True)
    spark.mkdir(parents=True)
    shutil.copy(ROOT / "scripts/spark_command.sh", bin_ / "beeline")
    (spark / "beeline").write_text('#!/bin/sh\necho "home=$SPARK_HOME python=$PYSPARK_PYTHON '
                                   'java=$JAVA_HOME args=$*"\n')
    (spark / "beeline").chmod(0o755)
    return bin_ / "beeline"


def test_the_launcher_sets_spark_home_and_passes_the_arguments(tmp_path):
    beeline = fake_venv(tmp_path)
    done = subprocess.run([str(beeline), "-u", "jdbc:hive2://h:1/d", "-e", "SELECT 1"], env=BARE,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    home = (tmp_path / "venv/lib/python3.11/site-packages/pyspark").resolve()
    assert f"home={home} " in done.stdout
    assert f"python={tmp_path.resolve() / 'venv/bin/python'} " in done.stdout
    assert done.stdout.strip().endswith("args=-u jdbc:hive2://h:1/d -e SELECT 1")


def test_a_java_home_without_java_is_said_plainly(tmp_path):
    beeline = fake_venv(tmp_path)
    done = subprocess.run([str(beeline), "--help"], env={**BARE, "JAVA_HOME": str(tmp_path / "nojava")},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and done.stdout == ""
    assert f"beeline: JAVA_HOME={tmp_path / 'nojava'} has no bin/java" in done.stderr


def test_a_venv_without_pyspark_is_said_plainly(tmp_path):
    beeline = fake_venv(tmp_path)
    shutil.rmtree(tmp_path / "venv/lib")
    done = subprocess.run([str(beeline)], env=BARE, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "beeline: no PySpark with bin/beeline" in done.stderr and "scripts/setup.sh" in done.stderr
