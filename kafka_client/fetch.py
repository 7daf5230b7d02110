"""The cluster's reads from Kafka: Fetch requests for every partition it follows, decoded as
columns by kafka_client.recordbatch (numpy over all the records of a response, no Python object per
record), so a node pays per record only for the records one of its sessions wants.

Through kafka-python's network client (connections, metadata, API versions, TLS/SASL), as the
sink's producer and the history job's source do; one Fetch request per leader at a time, on the
reader's thread (cluster/link.py).

Why not KafkaConsumer.poll(): it parses every record into a Python object (about 13 us each
here, 22% of a node's time under load, bench/cluster_bench.py), and a node reads every message
of the cluster, most of them for nobody on it.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from .gaps import HOLE_WAIT, Gaps
from .net import no_topic_creation
from .recordbatch import Decoded, decode
from .recordscan import Scanned

log = logging.getLogger(__name__)

GONE_AFTER = 2.0               # seconds a followed topic is missing from Kafka before it is a loss
MAX_BYTES = 4 << 20            # per partition and per response (Tansu may return whole batches)
RECEIVE_MAX = 256 << 20        # the largest response accepted (kafka-python's default: 100 MB)
# seconds a partition may be answered with no record while the same answers put its end beyond
# the position asked, before a warning: Tansu, the embedded Kafka, did so for up to 8 s with
# several readers fetching every 5 ms (bench/tansu_fetch_stall.py); Apache Kafka does not
STUCK_WARN = 2.0


class Fetcher:
    # whether a log that ends below what was read from it (Kafka lost data) sets every position
    # back to the start of the new logs (take_lost() says so); a reader that must not read a
    # record twice (sink/replay) says False and keeps its positions
    restart_on_loss = True
    create_topics = True
    _meta: Any = None
    # followed topics the next fetches leave out (their positions kept): a cluster node whose
    # sessions want nothing there now (cluster/interest.py)
    skip: frozenset[str] = frozenset()

    def __init__(self, bootstrap: str, kafka: dict, wait_ms: int,
                 decoder: Callable[[bytes, int | None], Any] | None = None,
                 create_topics: bool = True) -> None:
        """decoder(records bytes, gap_from): kafka_client.recordbatch's columns by default, or a
        kafka_client.recordscan.Scanned (Scanned itself: the cluster's keys-first reading);
        create_topics False: this client's metadata requests never create a missing topic
        (kafka_client.net.no_topic_creation)."""
        from kafka.net.compat import KafkaNetClient
        cfg = {k: v for k, v in kafka.items() if k in _CLIENT_OPTIONS}
        cfg.setdefault("client_id", "mqtt-cluster-reader")
        cfg["receive_message_max_bytes"] = RECEIVE_MAX
        self.client = KafkaNetClient(metrics=None, metric_group_prefix="consumer",
                                     bootstrap_servers=bootstrap.split(","), **cfg)
        self.create_topics = create_topics
        if not create_topics:
            no_topic_creation(self.client)
        self.client._manager.bootstrap(int(kafka.get("request_timeout_ms", 10000)))
        self.cluster = self.client.cluster
        # after a failed request: the metadata update asked for then, answered before the next
        # fetch (a Kafka that restarted empty would be asked for partitions it no longer has;
        # Tansu answers with what was written there since, which vanishes when the topic is
        # created again); and the id Kafka gave each followed topic (another id: recreated)
        self._meta: Any = None
        self.topic_ids: dict[str, Any] = {}
        self.missing: dict[str, float] = {}  # topic -> since when Kafka's metadata lacks it
        self.wait_ms = wait_ms
        self.decoder = decoder
        self.positions: dict[tuple[str, int], int] = {}   # (topic, partition) -> next offset
        self.high: dict[tuple[str, int], int] = {}        # high watermarks seen in responses
        # the partitions whose high watermark the last fetch's answer gave (one whose fetch
        # failed keeps an older one in `high`, which says nothing about what Kafka holds now)
        self.told: set[tuple[str, int]] = set()
        # why Kafka lost the data this reader had read (taken by take_lost()), and the cluster
        # id Kafka gave first (a new one: another, or a recreated, Kafka)
        self.lost: str | None = None
        self.cluster_id: str | None = None
        # the holes in Kafka's answers this reader asks again for (kafka_client/gaps.py)
        self.gaps = Gaps()
        # partitions answered empty below their end: since when, and whether it was said
        self.stuck_since: dict[tuple[str, int], tuple[float, bool]] = {}
        self.stuck = 0   # such spells that lasted STUCK_WARN seconds

    def take_lost(self) -> str | None:
        """Why Kafka lost data since the last call (every position was set back to the start of
        the new logs then), or None."""
        why, self.lost = self.lost, None
        return why

    def lost_data(self, why: str) -> None:
        """Kafka lost data (restarted empty, recreated, replaced): every followed partition is
        read again from the start of its new log (offset 0; a log that starts later answers out
        of range and is read from its start), and what was learnt of the old logs is dropped."""
        for tp in self.positions:
            self.positions[tp] = 0
        self.high.clear()
        self.told.clear()
        if self.lost is None:
            self.lost = why

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass

    # ------------------------------------------------------------ offsets
    def offsets(self, tps: list, which: str, timeout: float = 30.0) -> dict:
        """The earliest ("earliest") or next ("latest") offset of each (topic, partition);
        TimeoutError when Kafka has not given them all within `timeout` seconds."""
        from kafka.protocol.consumer import ListOffsetsRequest
        ts = -2 if which == "earliest" else -1
        out: dict = {}
        deadline = time.monotonic() + timeout
        while len(out) < len(tps):
            by_leader = self._by_leader([tp for tp in tps if tp not in out])
            T = ListOffsetsRequest.ListOffsetsTopic
            for node, parts in by_leader.items():
                topics: dict = {}
                for topic, p in parts:
                    topics.setdefault(topic, []).append(T.ListOffsetsPartition(
                        partition_index=p, current_leader_epoch=-1, timestamp=ts, max_num_offsets=1))
                req = ListOffsetsRequest(replica_id=-1, isolation_level=0,
                                         topics=[T(name=t, partitions=ps) for t, ps in topics.items()],
                                         min_version=1, max_version=7)
                resp = self._ask(node, req)
                for t in resp.topics:
                    for p in t.partitions:
                        if not p.error_code:
                            out[(t.name, p.partition_index)] = p.offset
            if len(out) < len(tps):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Kafka gave no offsets for {sorted(set(tps) - set(out))}")
                self._refresh(0.2)
        return out

    def sample_ends(self, topics: frozenset[str]) -> None:
        """`high` of the followed partitions of `topics` from their current ends (a ListOffsets
        request, no records): kept as fresh as a fetch keeps it while they are left out. Gives
        up after a second (the reading thread goes on; the next fetch of them says more)."""
        tps = [tp for tp in self.positions if tp[0] in topics]
        if tps:
            self.high.update(self.offsets(tps, "latest", timeout=1.0))

    # ------------------------------------------------------------ fetching
    def fetch(self) -> list:
        """One Fetch per leader for every followed partition: [(topic, partition, Decoded or
        Scanned, offset asked from)] for those with records (positions advanced past them);
        waits at most the fetch wait when there is nothing new."""
        from kafka import errors as Errors
        from kafka.protocol.consumer import FetchRequest
        F = FetchRequest.FetchTopic
        out: list[tuple[str, int, Any, int]] = []
        self.told.clear()
        cid = getattr(self.cluster, "cluster_id", None)
        if cid:
            if self.cluster_id is None:
                self.cluster_id = cid
            elif cid != self.cluster_id and self.restart_on_loss:
                self.lost_data(f"its cluster id changed from {self.cluster_id} to {cid}")
                self.cluster_id = cid
                return out
        failed = self._meta is not None  # (the metadata asked for after a failed request)
        if failed:
            if not self._meta.is_done:
                self.client.poll(timeout_ms=self.wait_ms, future=self._meta)
                if not self._meta.is_done:
                    return out
            self._meta = None
        if not self.create_topics and self.restart_on_loss and self._gone(failed):
            return out
        skip = self.skip
        by_leader = self._by_leader([tp for tp in self.positions if tp[0] not in skip] if skip
                                    else list(self.positions))
        if not by_leader:
            self._refresh(0.2)
            return out
        for node, parts in by_leader.items():
            topics: dict = {}
            for topic, p in parts:
                topics.setdefault(topic, []).append(F.FetchPartition(
                    partition=p, current_leader_epoch=-1, fetch_offset=self.positions[(topic, p)],
                    last_fetched_epoch=-1, partition_max_bytes=MAX_BYTES))
            req = FetchRequest(max_wait_ms=self.wait_ms, min_bytes=1, max_bytes=MAX_BYTES * 4,
                               isolation_level=0, session_id=0, session_epoch=-1,
                               forgotten_topics_data=[], rack_id="",
                               topics=[F(topic=t, partitions=ps) for t, ps in topics.items()],
                               min_version=4, max_version=12)
            try:
                resp = self._ask(node, req, self.wait_ms + 30_000)
            except Exception:
                self._meta = self.cluster.request_update()
                raise
            for t in resp.responses:
                for p in t.partitions:
                    tp = (t.topic, p.partition_index)
                    err = Errors.for_code(p.error_code)
                    if err is Errors.OffsetOutOfRangeError:
                        if self._out_of_range(tp):
                            return []
                        continue
                    if err is not Errors.NoError:
                        log.debug("cluster: fetch %s: %s", tp, err.__name__)
                        self._refresh(0)
                        continue
                    if p.high_watermark is not None and p.high_watermark >= 0:
                        if p.high_watermark < self.positions[tp] and self.restart_on_loss:
                            # the log ends below what was read from it: not the same log
                            self.lost_data(f"{tp[0]}-{tp[1]} ends at offset {p.high_watermark}, "
                                       f"below the {self.positions[tp]} already read from it")
                            return []
                        self.high[tp] = p.high_watermark
                        self.told.add(tp)
                    if not p.records:
                        self._answered_empty(tp)
                        continue
                    self.stuck_since.pop(tp, None)
                    pos = self.positions[tp]
                    d = self._decode(p.records, pos)
                    if d.gap is not None and d.gap[0] == pos:  # the answer skipped offsets
                        if self.gaps.wait(tp, d.gap):
                            continue  # asked again from the hole (kafka_client/gaps.py)
                        d = self._decode(p.records, None)  # read past it
                    elif tp in self.gaps.waiting:
                        self.gaps.read(tp, pos)
                    if d.next_offset is not None and d.next_offset > self.positions[tp]:
                        start = self.positions[tp]
                        self.positions[tp] = d.next_offset
                        if (d.end > start) if isinstance(d, Scanned) else len(d):
                            out.append((t.topic, p.partition_index, d, start))
        if not out and self.gaps.waiting:
            time.sleep(HOLE_WAIT)  # Kafka answers at once (records follow the hole): not a spin
        return out

    def _answered_empty(self, tp: tuple[str, int]) -> None:
        """`tp` was answered with no record: a spell begins when its end (as the same answer gave
        it) is beyond the position asked, and one that lasts STUCK_WARN seconds is said once and
        counted. The reading goes on as before; only the operator learns of it."""
        pos, end = self.positions[tp], self.high.get(tp, 0)
        if tp not in self.told or end <= pos:
            self.stuck_since.pop(tp, None)
            return
        now = self.gaps.clock()
        since, said = self.stuck_since.setdefault(tp, (now, False))
        if not said and now - since >= STUCK_WARN:
            self.stuck_since[tp] = (since, True)
            self.stuck += 1
            log.warning("%s-%d: Kafka has answered with no records for %.0f s while the partition "
                        "holds offsets %d to %d; the reading goes on. The embedded Kafka (Tansu) "
                        "does this while several readers fetch with a short wait: give this "
                        "reader a fetch wait of 20 ms or more (a cluster node: "
                        "cluster.fetch_wait_ms), or use Apache Kafka", tp[0], tp[1],
                        now - since, pos, end - 1)

    def _decode(self, raw: bytes, gap_from: int | None) -> Any:
        """The records of a fetch's answer, stopping where it skips offsets after `gap_from`
        (None: reading past them)."""
        if self.decoder is None:
            return decode(raw, check_crcs=False, gap_from=gap_from)
        return self.decoder(raw, gap_from)

    def _gone(self, failed: bool) -> bool:
        """(create_topics False) True, and lost_data(), when a topic read from has another id in
        Kafka's metadata (deleted and made again, or Kafka restarted empty and the topic made
        again), or is missing from it (not made again) in the first metadata after a failed
        request (Kafka restarted), or for GONE_AFTER seconds (a topic Kafka has no leader for
        yet is missing for a moment too); it is not made here (ensure_topics is the cluster's
        to call)."""
        ids = getattr(self.cluster, "_topic_ids", {})
        now = time.monotonic()
        for topic in {t for t, _ in self.positions}:
            tid, known = ids.get(topic), self.topic_ids.get(topic)
            if known is None:
                if tid is not None:
                    self.topic_ids[topic] = tid
                continue
            if tid is not None and tid != known:
                why = f"the topic {topic} was made again (its id changed)"
            elif self.cluster.partitions_for_topic(topic) is None:
                since = self.missing.setdefault(topic, now)
                if not failed and now - since < GONE_AFTER:
                    continue
                why = f"the topic {topic} is no longer in Kafka"
            else:
                self.missing.pop(topic, None)
                continue
            self.lost_data(why)
            self.topic_ids.clear()
            self.missing.clear()
            return True
        return False

    def _out_of_range(self, tp: tuple[str, int]) -> bool:
        """The log starts later (records deleted): from its start again. True when it ends
        earlier (Kafka lost data: every partition is read again from its start, _lost())."""
        early = self.offsets([tp], "earliest")[tp]
        late = self.offsets([tp], "latest")[tp]
        pos = self.positions[tp]
        if pos > late:
            self.lost_data(f"{tp[0]}-{tp[1]} ends at offset {late}, below the {pos} already read "
                       "from it")
            return True
        new = early if pos < early else pos
        log.warning("cluster: %s-%d: offset %d is outside the log [%d, %d): reading from %d",
                    tp[0], tp[1], pos, early, late, new)
        self.positions[tp] = new
        return False

    # ------------------------------------------------------------ plumbing
    def _by_leader(self, tps: list) -> dict:
        from kafka import TopicPartition
        out: dict = {}
        missing = False
        for topic, p in tps:
            leader = self.cluster.leader_for_partition(TopicPartition(topic, p))
            if leader is None or leader < 0:
                self.cluster.add_topic(topic)
                missing = True
                continue
            out.setdefault(leader, []).append((topic, p))
        if missing:
            self._refresh(0)
        return out

    def _refresh(self, wait_s: float) -> None:
        fut = self.cluster.request_update()
        self.client.poll(timeout_ms=int(wait_s * 1000), future=fut)

    def _ask(self, node: int, req: Any, timeout_ms: int = 30_000) -> Any:
        c = self.client
        deadline = time.monotonic() + timeout_ms / 1000
        while not c.ready(node):
            c.poll(timeout_ms=50)
            if time.monotonic() > deadline:
                raise ConnectionError(f"no connection to Kafka node {node}")
        fut = c.send(node, req)
        c.poll(timeout_ms=timeout_ms, future=fut)
        if not fut.is_done:
            raise TimeoutError("no answer from Kafka")
        if fut.failed():
            raise fut.exception
        return fut.value


_CLIENT_OPTIONS = ("security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password",
                   "ssl_check_hostname", "sasl_mechanism", "sasl_plain_username",
                   "sasl_plain_password", "sasl_kerberos_service_name", "request_timeout_ms",
                   "connections_max_idle_ms", "reconnect_backoff_ms", "reconnect_backoff_max_ms",
                   "api_version", "client_id")


class Records:
    """The records of a Decoded at or after `start` (a fetch may begin inside a batch), read in
    Python only as far as asked: key(i) first (the MQTT topic, to match), the rest with
    record(i) for the few records wanted."""

    def __init__(self, d: Decoded, start: int) -> None:
        raw = d.data.base if isinstance(d.data.base, bytes) else d.data.tobytes()
        self.mv = memoryview(raw)
        self.offsets = d.offset.tolist()
        self.first = next((i for i, o in enumerate(self.offsets) if o >= start), len(self.offsets))
        self.ks, self.kl = d.key[0].tolist(), d.key[1].tolist()
        self.d = d
        self._rest: tuple[list[Any], ...] | None = None

    def __len__(self) -> int:
        return len(self.offsets) - self.first

    def indexes(self) -> range:
        return range(self.first, len(self.offsets))

    def key(self, i: int) -> bytes | None:
        n = self.kl[i]
        return None if n < 0 else bytes(self.mv[self.ks[i]:self.ks[i] + n])

    def record(self, i: int) -> tuple:
        """(offset, key, value, [(header name, value)], timestamp ms)."""
        if self._rest is None:
            d = self.d
            self._rest = (d.value[0].tolist(), d.value[1].tolist(), d.hoff.tolist(),
                          d.hkey[0].tolist(), d.hkey[1].tolist(), d.hvalue[0].tolist(),
                          d.hvalue[1].tolist(), d.timestamp.tolist())
        vs, vl, hoff, hks, hkl, hvs, hvl, ts = self._rest
        mv = self.mv
        value = None if vl[i] < 0 else bytes(mv[vs[i]:vs[i] + vl[i]])
        headers = [(str(mv[hks[j]:hks[j] + hkl[j]], "utf-8"),
                    None if hvl[j] < 0 else bytes(mv[hvs[j]:hvs[j] + hvl[j]]))
                   for j in range(hoff[i], hoff[i + 1])]
        return self.offsets[i], self.key(i), value, headers, ts[i]
