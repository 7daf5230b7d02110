"""broker/auth/checks.py: the bounded password-check queue, on a real event loop and threads."""
import asyncio
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.auth.checks import THREAD_NAME, CheckQueue


def run(jobs, max_pending, threads, gone=()):
    """Submit (key, id) jobs at once; then the clients of ids in `gone` leave, then the checks
    held at the gate may finish.
    Returns (accepted ids, run order, done ids, the queue, peak pending, thread names)."""
    ran, done, names, peak = [], [], set(), [0]
    gate = threading.Event()
    left = []

    async def main():
        q = CheckQueue(threads, max_pending)
        accepted = []

        def make(i):
            def fn():
                names.add(threading.current_thread().name)
                gate.wait(10)
                ran.append(i)
                return i

            return fn, done.append

        for key, i in jobs:
            fn, on_done = make(i)
            if q.submit(key, fn, lambda i=i: not (left and i in gone), on_done):
                accepted.append(i)
            peak[0] = max(peak[0], q.pending)
        left.append(True)
        gate.set()
        for _ in range(3000):  # skipped checks report nothing: wait until none is pending
            if not q.pending:
                break
            await asyncio.sleep(0.01)
        q.close()
        return accepted, q

    accepted, q = asyncio.run(main())
    return accepted, ran, done, q, peak[0], names


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(st.sampled_from("abc"), max_size=30), max_pending=st.integers(1, 12),
       threads=st.integers(1, 3), gone=st.sets(st.integers(0, 29)))
def test_bound_skip_and_accounting(keys, max_pending, threads, gone):
    jobs = list(zip(keys, range(len(keys))))
    accepted, ran, done, q, peak, names = run(jobs, max_pending, threads, gone)
    assert accepted == [i for _, i in jobs][:max_pending]        # first come, then refused
    assert q.refused == len(jobs) - len(accepted)
    assert peak <= max_pending and q.pending == 0 and q.running == 0
    # every accepted check runs once and reports, unless its client left before its turn
    # (the first `threads` were already running when the clients left)
    expected = sorted(i for n, i in enumerate(accepted) if n < threads or i not in gone)
    assert sorted(ran) == expected and sorted(done) == expected
    assert q.skipped == len(accepted) - len(expected)
    assert all(n.startswith(THREAD_NAME) for n in names)


def test_round_robin_across_addresses():
    # one address floods, another comes later: its check runs second, not after the flood
    jobs = [("flood", i) for i in range(8)] + [("other", 100)]
    _, ran, _, _, _, _ = run(jobs, max_pending=20, threads=1)
    assert ran.index(100) <= 2, ran


def test_config_keys(tmp_path):
    """The bounds of password checks are [auth] keys the server reads from its section: the
    check queue's threads and length, the bytes a client may send while its check runs."""
    import pytest

    from broker.auth import from_config, hash_password
    from broker.server import Server
    from settings import AuthConfig, Config
    pw = tmp_path / "passwd"
    pw.write_text(f"alice:{hash_password('x', n=2 ** 4)}\n")
    cfg = Config(data_dir=str(tmp_path), auth=AuthConfig.from_table(
        {"password_file": str(pw), "max_pending_checks": 8, "check_threads": 3,
         "max_deferred_bytes": 4096}))
    server = Server(cfg, auth=from_config(cfg.auth))
    try:
        q = server.auth_checks
        assert (q.max_pending, q.threads, server.broker.max_deferred_bytes) == (8, 3, 4096)
    finally:
        server.auth_checks.close()
    cfg = Config(data_dir=str(tmp_path), auth=AuthConfig(password_file=str(pw)))
    server = Server(cfg, auth=from_config(cfg.auth))
    try:
        q = server.auth_checks
        assert (q.max_pending, server.broker.max_deferred_bytes) == (64, 1 << 20)
    finally:
        server.auth_checks.close()
    for bad in ({"max_pending_checks": 0}, {"check_threads": -1}, {"max_deferred_bytes": "1M"}):
        with pytest.raises(ValueError, match="auth.max_pending_checks|auth.check_threads|"
                                             "auth.max_deferred_bytes"):
            from_config({"password_file": str(pw), **bad})
