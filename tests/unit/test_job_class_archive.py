"""The history job JVM's class-data archive (sink/history/job/class_archive.py): used only when
made for the same JVM and class path, and a class path Java can archive (jars only)."""
from __future__ import annotations

import os
import zipfile

import pytest

from sink.history import guard
from sink.history.job import class_archive


@pytest.fixture
def java(tmp_path, monkeypatch):
    fake = tmp_path / "jdk" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    return fake


def test_the_job_maps_the_archive_made_for_its_class_path_only(tmp_path, java):
    build = tmp_path / "build"
    assert class_archive.java_options(build, "/x/guard.jar") == ""   # none made: started as before
    made = class_archive.archive_path(build, "/x/guard.jar")
    assert made is not None
    made.parent.mkdir(parents=True)
    made.write_bytes(b"archive")
    assert class_archive.java_options(build, "/x/guard.jar") == f"-XX:SharedArchiveFile={made}"
    # another class path (another guard build) or another JVM: that archive would not load
    assert class_archive.java_options(build, "/y/guard.jar") == ""
    java.write_text("#!/bin/sh\n# another JDK\n")
    st = java.stat()
    os.utime(java, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert class_archive.archive_path(build, "/x/guard.jar") != made


def test_the_guard_is_on_the_class_path_as_a_jar_of_its_classes(tmp_path, monkeypatch):
    """Java's class-data archive refuses a class path with a non-empty directory ("Cannot have
    non-empty directory in paths"): the guard's classes go on it as a jar."""
    classes = tmp_path / "history-jvm-0123" / "mqtthistory"
    classes.mkdir(parents=True)
    (classes / "ReadOnlyGuard.class").write_bytes(b"\xca\xfe\xba\xbe")
    monkeypatch.setattr(guard, "classes_dir", lambda root: tmp_path / "history-jvm-0123")
    cp = guard.launch_conf(tmp_path)["spark.driver.extraClassPath"]
    assert cp.endswith(".jar")
    with zipfile.ZipFile(cp) as z:
        assert z.namelist() == ["mqtthistory/ReadOnlyGuard.class"]
        assert z.read("mqtthistory/ReadOnlyGuard.class") == b"\xca\xfe\xba\xbe"
