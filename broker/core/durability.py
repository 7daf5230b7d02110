"""What an acknowledgement waits for: the durability contract between the core and its hooks.

A hook that makes accepted messages durable (the state store, the Kafka sink's spool, the
cluster's Kafka log) provides `barrier()`: it returns a `Pending` that resolves once everything
the hook was handed so far is durable, or None when nothing it holds waits. After a read whose
QoS 1/2 PUBLISHes were accepted, the ack gate (broker/transport/connection_protocol.py) asks
every such hook once and sends the acks when all their tokens resolved: successes, or the
failure reason code when any failed. A broker with no such hook sends acks at once.

Sans-I/O: a Pending is resolved by whoever owns the I/O (a commit, an fsync, a Kafka ack), on
the event loop's thread.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence


class Pending:
    """Resolved once: `failure` None (durable) or a reason (never acknowledge as a success)."""
    __slots__ = ("done", "failure", "_callbacks")

    def __init__(self) -> None:
        self.done = False
        self.failure: str | None = None
        self._callbacks: list[Callable[[Pending], None]] | None = None

    def add_done_callback(self, fn: Callable[["Pending"], None]) -> None:
        """fn(self) once resolved: at once if it is already."""
        if self.done:
            fn(self)
        elif self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    def resolve(self, failure: str | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.failure = failure
        callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            fn(self)

    def __repr__(self) -> str:
        state = "pending" if not self.done else "failed: " + self.failure if self.failure else "durable"
        return f"<Pending {state}>"


def when_all(tokens: Sequence[Pending], fn: Callable[[str | None], None]) -> None:
    """fn(failure) once every token resolved: None when all are durable, else the first
    failure (in the order given)."""
    left = [len(tokens)]

    def one_done(_: Pending) -> None:
        left[0] -= 1
        if left[0] == 0:
            fn(next((t.failure for t in tokens if t.failure is not None), None))

    for t in tokens:
        t.add_done_callback(one_done)
