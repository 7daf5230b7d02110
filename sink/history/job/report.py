"""What the job tells the broker in its data directory (sink/history/commits.py): that it runs
(announce), and what the table has committed (report_commits), signed with the broker's key."""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable

from sink.history.job.config import Job
from sink.history.job.connect import connect_enabled
from sink.history.job.progress import committed_from_checkpoint
from sink.history.paths import is_local_path
from sink.history.paths import local as _local

log = logging.getLogger(__name__)


def report_commits(job: Job) -> Callable[[], None] | None:
    """Keep ``progress.committed_path(table, checkpoint)`` up to date from the checkpoint's
    commit log: now (a job killed between a commit and its report catches up) and then each
    time the function returned is called (at every poll of the run: sink/history/job/runner.py),
    so within a poll interval of each commit. None: a remote checkpoint (nothing to report).

    The commit log is read rather than listening to query progress: a Python
    StreamingQueryListener costs the JVM a py4j callback per batch whose conversion looks
    classes up through the class path (about 5% of the job's JVM CPU, bench/spark_bench.py)."""
    if not is_local_path(job.history.checkpoint_dir):
        return None  # the broker reads a local file only
    from sink.history.commits import committed_path, write_committed
    path = committed_path(job.history.table, str(_local(job.history.checkpoint_dir)))
    newest = [-1, False]    # last batch written, and whether it was signed
    key = committed_key(job)

    def catch_up() -> None:
        last = committed_from_checkpoint(job.history.checkpoint_dir)
        k = key()
        if not last or not last[1] or (last[0] <= newest[0] and (newest[1] or k is None)):
            return
        try:
            write_committed(path, *last, key=k, table=os.path.abspath(job.history.table))
            newest[:] = [last[0], k is not None]
        except OSError as exc:  # the table is still right; the spool just keeps more
            log.warning("cannot write %s (%s): the broker's spool keeps records longer", path, exc)

    catch_up()
    return catch_up


def committed_key(job: Job) -> Callable[[], bytes | None]:
    """A function giving the key that signs the committed file, once the broker made its secret
    (a job started first writes unsigned files, which the broker ignores, until then)."""
    from settings import secrets
    found: list = []
    warned = [False]

    def key() -> bytes | None:
        if not found and job.data_dir:
            k = secrets.sink_key(job.data_dir)
            if k is not None:
                found.append(secrets.derive(k, secrets.COMMITTED))
            elif not warned[0]:
                warned[0] = True
                log.warning("no broker key in %s yet (the broker makes it when its sink starts): "
                            "what the table commits is reported unsigned, which the broker "
                            "ignores, until it is there", secrets.secrets_dir(job.data_dir))
        return found[0] if found else None
    return key


def announce(job: Job) -> None:
    """Say in the broker's data directory, at once, that this job runs, which table it writes
    and where it reports its commits, so a broker that looks elsewhere can say so and one
    that waits for the first commit knows a job is starting (sink/forward/forwarder.py)."""
    if not job.data_dir or not is_local_path(job.history.checkpoint_dir):
        return
    from sink.history.commits import atomic_write, committed_path, job_file
    committed_file = committed_path(job.history.table, str(_local(job.history.checkpoint_dir)))
    table = job.history.table
    info = {"pid": os.getpid(), "started_at": time.time(),
            "table": os.path.abspath(table) if is_local_path(table) else table,
            "committed_file": os.path.abspath(committed_file),
            # where its Spark Connect server will answer (sink.query waits there, not elsewhere)
            "serves_connect_at": job.history.connect_url if connect_enabled(job) else None}
    try:
        os.makedirs(job.data_dir, exist_ok=True)
        atomic_write(job_file(job.data_dir, table), json.dumps(info).encode())
    except OSError as exc:
        log.warning("cannot write %s: %s", job_file(job.data_dir, table), exc)

