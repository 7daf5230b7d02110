"""scripts/setup.sh installs Debian's mosquitto for its binary (the benchmarks run it side by
side) but never leaves its service holding port 1883 (scripts/mosquitto_service.sh), with stand-in
systemctl / apt-get commands that record how they were called."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT

SCRIPT = str(ROOT / "scripts" / "mosquitto_service.sh")


def fake_bin(tmp_path, enabled: bool):
    b = tmp_path / "bin"
    b.mkdir()
    calls = tmp_path / "calls"
    for name, body in (("systemctl", f'echo "systemctl $*" >> {calls}\n'
                                     f'case "$1" in is-enabled|is-active) exit {0 if enabled else 1};; esac\n'),
                       ("apt-get", f'echo "apt-get $* policy=$([ -x {tmp_path}/policy-rc.d ] && '
                                   f'{tmp_path}/policy-rc.d; echo $?)" >> {calls}\n')):
        (b / name).write_text("#!/bin/sh\n" + body)
        (b / name).chmod(0o755)
    (tmp_path / "systemd").mkdir()
    env = {**os.environ, "PATH": f"{b}:{os.environ['PATH']}", "SYSTEMD_DIR": str(tmp_path / "systemd"),
           "POLICY_RC_D": str(tmp_path / "policy-rc.d")}
    return env, calls


def run(args, env):
    return subprocess.run(["bash", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=30)


def test_a_running_mosquitto_service_is_stopped_and_disabled(tmp_path):
    env, calls = fake_bin(tmp_path, enabled=True)
    p = run(["disable"], env)
    assert p.returncode == 0 and "stopped and disabled the mosquitto service" in p.stdout
    assert "systemctl disable --now mosquitto" in calls.read_text()


def test_nothing_is_done_when_the_service_is_not_there(tmp_path):
    env, calls = fake_bin(tmp_path, enabled=False)
    p = run(["disable"], env)
    assert p.returncode == 0 and p.stdout == ""
    assert "disable" not in calls.read_text()


def test_no_service_starts_during_the_install(tmp_path):
    """apt-get runs with a policy-rc.d that refuses service starts (exit 101), removed after."""
    env, calls = fake_bin(tmp_path, enabled=False)
    p = run(["install", "mosquitto"], env)
    assert p.returncode == 0, p.stderr
    assert "install -y -qq mosquitto policy=101" in calls.read_text()
    assert not (tmp_path / "policy-rc.d").exists()


def test_setup_uses_it():
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert "mosquitto_service.sh install" in text and "mosquitto_service.sh disable" in text


def test_setup_stops_when_apt_get_fails(tmp_path):
    """A failed apt-get install stops setup.sh there, saying what failed and what to run, rather
    than going on to a .venv whose tests then fail for a missing Java or client."""
    if os.geteuid() != 0:
        pytest.skip("setup.sh installs Debian packages only as root; this run is not root")
    b = tmp_path / "bin"
    b.mkdir()
    (b / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package openjdk' >&2\nexit 100\n")
    (b / "apt-get").chmod(0o755)
    for tool in ("bash", "dirname", "id", "chmod", "rm"):  # nothing else: no java, no mosquitto
        (b / tool).symlink_to(subprocess.run(["which", tool], capture_output=True, text=True,
                                             check=True).stdout.strip())
    env = {"PATH": str(b), "POLICY_RC_D": str(tmp_path / "policy-rc.d"), "HOME": str(tmp_path)}
    p = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "setup.sh")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "setup: ERROR: apt-get could not install" in p.stderr
    assert "apt-get install openjdk-17-jre-headless" in p.stderr
    assert "creating .venv" not in p.stdout and "installing pinned" not in p.stdout
