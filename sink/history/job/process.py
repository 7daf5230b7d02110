"""The job's process: its niceness (and its session's autogroup), the SIGINT/SIGTERM handler
with the hooks a third signal runs before exiting, where the read-only guard is compiled, and a
log filter for py4j."""
from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

AUTOGROUP = "/proc/self/autogroup"
AUTOGROUP_RETRY_SECONDS = 0.11  # the kernel takes one autogroup write per 100 ms (below)


def lower_priority(nice: int) -> None:
    """Run at niceness `nice` (never raised back if already lower); the JVM and the Python
    workers started later inherit it.

    Linux with autogroup scheduling (sched_autogroup_enabled=1) shares the CPU fairly between
    sessions first and applies a process's niceness only within its session: a job started in
    its own session (setsid, as a supervisor or `start_new_session` does) would still take
    half the CPU from the broker under load. Such a job leads its session, whose autogroup
    holds only it and its children, so it lowers the autogroup's niceness too."""
    try:
        now = os.getpriority(os.PRIO_PROCESS, 0)
        if nice > now:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            log.info("running at niceness %d ([history] nice): the broker's CPU comes first", nice)
    except OSError as exc:
        log.warning("cannot set niceness %d: %s", nice, exc)
    if os.getsid(0) != os.getpid():
        return  # sharing a session (and its autogroup) with others: the niceness above is enough
    try:
        with open(AUTOGROUP) as f:
            text = f.read()
        if not text.strip():
            return  # the kernel's default autogroup (init's session) shows nothing: none of ours
        now = int(text.rsplit("nice", 1)[1])
    except FileNotFoundError:
        return  # no autogroup scheduling on this kernel
    except (OSError, ValueError, IndexError) as exc:
        log.warning("cannot read this session's autogroup (%s): %s", AUTOGROUP, exc)
        return
    if nice > now:
        set_autogroup_nice(nice)


def set_autogroup_nice(nice: int, attempts: int = 10) -> bool:
    """Write `nice` to this session's autogroup. Without CAP_SYS_ADMIN the kernel accepts one
    such write per 100 ms on the whole machine and answers EAGAIN to the others
    (proc_sched_autogroup_set_nice): wait and retry."""
    for attempt in range(attempts):
        try:
            fd = os.open(AUTOGROUP, os.O_WRONLY)
            try:
                os.write(fd, str(nice).encode())
            finally:
                os.close(fd)
            return True
        except BlockingIOError:
            if attempt + 1 < attempts:
                time.sleep(AUTOGROUP_RETRY_SECONDS)
        except OSError as exc:
            log.warning("cannot set the niceness of this session's autogroup (%s) to %d: %s",
                        AUTOGROUP, nice, exc)
            return False
    log.warning("cannot set the niceness of this session's autogroup (%s) to %d: the kernel "
                "kept answering EAGAIN (it rate-limits these writes) for %.1f s",
                AUTOGROUP, nice, attempts * AUTOGROUP_RETRY_SECONDS)
    return False


#: run before a third signal ends the job at once, by name: a restarted query replaces its
#: earlier run's hook rather than adding one (on_hard_exit)
hard_exit_hooks: dict[str, Callable[[], None]] = {}


def on_hard_exit(name: str, hook: Callable[[], None]) -> None:
    """Run ``hook`` before a third signal ends the job; it replaces an earlier hook of that name."""
    hard_exit_hooks[name] = hook


def stop_on_signals(stop: threading.Event) -> Callable[[int, FrameType | None], None]:
    """The SIGINT/SIGTERM handler: the first asks for a clean stop; the next one (Ctrl-C
    twice, or a terminal's SIGINT followed by a supervisor's SIGTERM) only says that the stop is
    under way; a third exits at once, after reporting the last committed batch to the broker."""
    count = [0]

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        count[0] += 1
        if count[0] == 1:
            log.info("%s received: stopping (every committed batch is kept; a batch in progress "
                     "is redone at the next start)", name)
            stop.set()
        elif count[0] == 2:
            log.info("%s again: already stopping, in a few seconds (the query stops, then the "
                     "last commit is reported to the broker); a third signal exits at once", name)
        else:
            log.warning("%s a third time: exiting now, without waiting for the query to stop (the "
                        "batch in progress is redone at the next start; committed batches are "
                        "kept and reported to the broker first)", name)
            for hook in list(hard_exit_hooks.values()):
                try:
                    hook()
                except Exception as exc:  # exiting anyway: say what was not done
                    log.error("could not report the last commit to the broker: %s", exc)
            os._exit(130)
    return on_signal


def guard_build_root(data_dir: str | None) -> Path:
    """Where the guard's classes are compiled: the checkout's build/, or, where that cannot be
    written (an image installed read-only, as deploy/Dockerfile's), the data directory's."""
    from sink.history.spark import PROJECT_ROOT
    root = Path(PROJECT_ROOT) / "build"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    return Path(data_dir or tempfile.gettempdir()) / "build"


def quiet_py4j_retry(record: logging.LogRecord) -> bool:
    """A log filter: py4j logs "Exception while sending command." with its traceback at INFO on
    the root logger when a pooled connection to the JVM was closed while idle, then sends the
    command again on a new one (nothing failed). A retry that fails too is logged at ERROR
    (logging.exception), which passes."""
    return not (record.name == "root" and record.levelno == logging.INFO
                and record.module == "java_gateway")

