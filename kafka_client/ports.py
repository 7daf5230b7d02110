"""Who listens on a TCP port: for errors that say which process holds a port we need (the
broker's listeners, the embedded Kafka). Linux: /proc/net/tcp{,6} give the listening socket's
inode, /proc/<pid>/fd the process that holds it (another user's processes only to root); else
`ss -ltnp` when present. A leaf module: the standard library only.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess

LISTEN = "0A"


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return inodes


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def holders(port: int) -> list[tuple[int, str]] | None:
    """[(pid, command line)] of the processes listening on `port`; [] when nobody listens;
    None when it cannot be told (a listener of another user, without root, and no `ss`)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return [] if os.path.exists("/proc/net/tcp") else _ss(port)
    wanted = {f"socket:[{i}]" for i in inodes}
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    found.append((int(pid), _cmdline(int(pid))))
                    break
            except OSError:
                continue
    return found or _ss(port)


def _ss(port: int) -> list[tuple[int, str]] | None:
    ss = shutil.which("ss")
    if not ss:
        return None
    try:
        out = subprocess.run([ss, "-Hltnp", f"sport = :{port}"], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = []
    for part in out.split("pid=")[1:]:
        pid = part.split(",")[0]
        if pid.isdigit():
            found.append((int(pid), _cmdline(int(pid))))
    return found or None


def describe(port: int) -> str:
    """", held by pid 123 (/usr/sbin/mosquitto -c ...)" or what can be said instead."""
    who = holders(port)
    if who is None:
        return (f", held by a process this user cannot see (as root, `ss -ltnp 'sport = :{port}'` "
                "names it)")
    if not who:
        return ""
    return ", held by " + ", ".join(f"pid {pid} ({cmd})" for pid, cmd in who)


def listening(host: str, port: int, timeout: float = 0.3) -> bool:
    """Whether something accepts connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
