"""The rules' MQTT client: QoS 1 PUBLISHes through the broker, as ``settings.rules.RULES_USER``
with the password in the data directory (never a way around the broker: its ACL applies).

``publish_all`` returns only when the broker acknowledged every PUBLISH (PUBACK with a success
reason code); otherwise it raises PublishError, the rule's micro-batch fails and is run again
from its checkpoint: at least once to the broker (a batch interrupted after some PUBACKs
publishes those rows again).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    """The broker did not take a rule's rows; the message says why and what to check."""


class Publisher:
    """One MQTT 5 connection (paho-mqtt), opened on first use and again after it drops."""

    def __init__(self, host: str, port: int, username: str, password: str, client_id: str,
                 timeout: float = 30.0, max_inflight: int = 1000) -> None:
        self.host, self.port, self.username, self.password = host, port, username, password
        self.client_id, self.timeout, self.max_inflight = client_id, timeout, max_inflight
        self._client: Any = None
        self._lock = threading.Lock()
        self._refused = ""
        self._refusals: dict[int, str] = {}   # PUBACKs with an error reason code, by packet id
        self._window = max_inflight   # PUBLISHes in flight at most (publish_all)

    def _connect(self):
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        connected = threading.Event()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                        protocol=mqtt.MQTTv5)
        c.username_pw_set(self.username, self.password)
        # no window in paho (at every PUBACK its window scans every message not yet
        # acknowledged: quadratic in a batch's rows); publish_all keeps its own
        c.max_inflight_messages_set(0)
        c.max_queued_messages_set(0)

        def on_connect(client, userdata, flags, reason, props):
            self._refused = "" if not reason.is_failure else str(reason)
            # the broker's Receive Maximum bounds the window [MQTT-3.3.4-7]
            self._window = max(1, min(self.max_inflight, getattr(props, "ReceiveMaximum", 65535)))
            connected.set()
        def on_publish(client, userdata, mid, reason, props):
            if reason is not None and reason.is_failure:
                self._refusals[mid] = str(reason)
        c.on_connect = on_connect
        c.on_publish = on_publish
        self._refused = ""
        try:
            c.connect(self.host, self.port, keepalive=30)
        except OSError as exc:
            raise PublishError(f"cannot reach the broker at {self.host}:{self.port} ({exc}): is "
                               f"it running? (the job takes its address from [broker] host/port)"
                               ) from exc
        c.loop_start()
        if not connected.wait(self.timeout) or self._refused:
            c.loop_stop()
            c.disconnect()
            why = self._refused or f"no CONNACK in {self.timeout:g} s"
            raise PublishError(f"the broker at {self.host}:{self.port} refused the rules client "
                               f"{self.username!r}: {why} (the broker must know it: start both "
                               f"with the same --config and data directory)")
        return c

    def publish_all(self, topic: str, payloads: Iterable[bytes]) -> int:
        """Publish each payload QoS 1 and wait for every PUBACK, at most a window's worth
        (``max_inflight``, and the broker's Receive Maximum) in flight. Returns how many."""
        rows = list(payloads)
        with self._lock:
            if self._client is None or not self._client.is_connected():
                if self._client is not None:
                    self._client.loop_stop()
                self._client = None
                self._client = self._connect()
            c = self._client
            self._refusals.clear()
            for start in range(0, len(rows), self._window):
                self._acknowledged(topic, [c.publish(topic, p, qos=1)
                                           for p in rows[start:start + self._window]])
            return len(rows)

    def _acknowledged(self, topic: str, infos: list[Any]) -> None:
        """Wait for the PUBACK of each (``timeout`` for them all); PublishError if one does not
        come or refuses."""
        deadline = time.monotonic() + self.timeout
        for info in infos:
            left = deadline - time.monotonic()
            try:
                info.wait_for_publish(max(left, 0.001))
            except (RuntimeError, ValueError) as exc:
                raise PublishError(f"publishing to {topic}: {exc}") from exc
            if not info.is_published():
                raise PublishError(f"publishing to {topic}: no PUBACK in {self.timeout:g} s "
                                   f"(the broker is not taking the rule's messages)")
            why = self._refusals.pop(info.mid, "")
            if why:
                raise PublishError(f"the broker refused a PUBLISH to {topic}: {why} (may "
                                   f"the rules client publish there? docs/rules.md)")

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.disconnect()
                self._client.loop_stop()
                self._client = None
