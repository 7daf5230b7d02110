"""Fixtures for the end-to-end tests: one SparkSession per test run, embedded Kafka (Tansu)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole run (starting one takes 8-14 s), with the job's
    optimizer rule for variant fields (sink/history/jvm/VariantCastPushdown.scala) as the job
    runs it; not the job's read-only guard (these tests write tables)."""
    from sink.history import guard
    from sink.history.job import guard_build_root
    from sink.history.spark import get_spark
    session = get_spark("mqtt-history-tests", conf=guard.variant_conf(guard_build_root(None)))
    yield session
    session.stop()


@pytest.fixture
def kafka(tmp_path):
    """A fresh embedded Kafka (Tansu, memory only) per test."""
    from kafka_client.embedded import EmbeddedKafka
    k = EmbeddedKafka(log_file=str(tmp_path / "tansu.log"))
    k.start()
    try:
        yield k
    finally:
        k.stop()
