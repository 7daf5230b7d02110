"""The Kafka probe: wait until Kafka accepts connections before Spark starts."""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


def check_kafka(bootstrap: str, timeout: float = 10.0,
                stop: threading.Event | None = None) -> None:
    """Wait until Kafka accepts connections; fail with a clear message after ``timeout`` s."""
    import socket
    last, warned = None, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        for server in bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    return
            except OSError as exc:
                last = exc
        if time.monotonic() - warned > 10:
            warned = time.monotonic()
            log.warning("waiting for Kafka at %s (%s)", bootstrap, last)
        time.sleep(0.5)
    if stop and stop.is_set():
        return
    raise ConnectionError(f"cannot reach Kafka at {bootstrap} ({last}). Is Kafka running? "
                          "Set the address with --kafka-bootstrap or [sink] bootstrap_servers")
