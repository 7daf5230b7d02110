"""Password checks off the event loop: a few worker threads and a bounded queue.

scrypt costs tens of milliseconds of CPU and releases the GIL, so checks run on a small
dedicated thread pool (``auth.check_threads``). What a client can make the broker hold is
bounded: at most ``auth.max_pending_checks`` checks wait or run at once; a CONNECT beyond that
is refused at once (the caller answers CONNACK 0x89 Server busy / 3.1.1 return code 3), so a
flood of wrong passwords delays a good CONNECT by at most the bound, not by the flood.

Checks are started from the event loop only when a worker is free, and a check whose client
has gone (``still_wanted()`` is false when its turn comes) is skipped, never run. Waiting
checks are started round robin across client addresses, so one address flooding the queue
does not make the checks of others wait behind all of its own (the bound itself is global).
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Hashable

from settings import AuthConfig

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING = AuthConfig().max_pending_checks  # [auth] max_pending_checks
THREAD_NAME = "auth-check"


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class CheckQueue:
    """submit(key, fn, still_wanted, done): run fn() in a worker, then done(result) on the loop
    (result None when fn raised)."""

    def __init__(self, threads: int = 0, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.threads = threads or default_threads()
        self.max_pending = max_pending
        self.executor = ThreadPoolExecutor(self.threads, thread_name_prefix=THREAD_NAME)
        self.waiting: dict = {}   # key (client address) -> deque of jobs; dict order = turn order
        self.running = 0
        self.pending = 0          # waiting + running, never above max_pending
        self.refused = 0          # submits refused because the queue was full
        self.skipped = 0          # checks not run because the client left before their turn

    def submit(self, key: Hashable, fn: Callable[[], Any], still_wanted: Callable[[], bool],
               done: Callable[[Any], None]) -> bool:
        """Queue a check; False (nothing queued) when max_pending checks are already pending."""
        if self.pending >= self.max_pending:
            self.refused += 1
            return False
        self.pending += 1
        q = self.waiting.get(key)
        if q is None:
            q = self.waiting[key] = deque()
        q.append((fn, still_wanted, done))
        self._dispatch()
        return True

    def _dispatch(self) -> None:
        waiting = self.waiting
        while self.running < self.threads and waiting:
            key = next(iter(waiting))
            q = waiting.pop(key)
            fn, still_wanted, done = q.popleft()
            if q:
                waiting[key] = q  # round robin: this address goes to the back of the line
            if not still_wanted():
                self.pending -= 1
                self.skipped += 1
                continue
            self.running += 1
            fut = asyncio.get_running_loop().run_in_executor(self.executor, fn)
            fut.add_done_callback(lambda f, done=done: self._finished(f, done))  # type: ignore[misc]

    def _finished(self, fut: asyncio.Future[Any], done: Callable[[Any], None]) -> None:
        self.running -= 1
        self.pending -= 1
        try:
            if fut.cancelled():
                return
            try:
                result = fut.result()
            except Exception:
                log.exception("password check failed")
                result = None  # done() answers with an error code
            done(result)
        finally:
            self._dispatch()

    def close(self) -> None:
        self.waiting.clear()
        self.executor.shutdown(wait=False, cancel_futures=True)
