"""A Kafka streaming source for Spark written with PySpark's Python Data Source API.

Used when Spark's own connector (spark-sql-kafka-0-10) is not on the classpath; it returns
exactly the rows of the native source with ``includeHeaders=true`` (sink.schema.KAFKA_SCHEMA)
and understands the same option names:

    spark.dataSource.register(KafkaPythonSource)
    spark.readStream.format("mqtt_kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9092")
        .option("subscribe", "mqtt.messages")          # comma list, or subscribePattern=<regex>
        .option("startingOffsets", "earliest")         # or latest
        .option("maxOffsetsPerTrigger", "100000")      # optional admission control
        .load()

How it works
- Offsets are JSON: ``{"t": {topic: {partition: next_offset}}, "ids": {topic: topic_id}}``.
  The end offset of a micro-batch is planned on the driver (``latestOffset``); executors read
  ``[start, end)`` of each partition with kafka-python (manual assign + seek, no consumer group),
  one InputPartition per Kafka partition range, and return Arrow record batches.
- The end of a partition is the Fetch high watermark, not ListOffsets (Tansu under-reports the
  latter). On real Kafka both agree.
- Admission control: ``maxOffsetsPerTrigger`` becomes the default ReadMaxRows limit; with
  Trigger.AvailableNow the target offsets are fixed in ``prepareForTriggerAvailableNow``.
- Offsets going backwards (the embedded Tansu keeps topics in memory, so a restart empties them;
  also a deleted and recreated topic): detected by a changed Kafka topic id, or by a high
  watermark below the committed start. A WARNING is logged and the partition is read again from
  its beginning. ``partitions(start, end)`` derives this from the two offsets alone, so a
  replayed batch reads the same records. Anything read twice is removed by the job's
  message_id de-duplication.
"""
from __future__ import annotations

import json
import logging
import re
import sys
import time
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from sink.schema import KAFKA_SCHEMA

log = logging.getLogger("sink.source")

FORMAT_NAME = "mqtt_kafka"
ARROW_BATCH_ROWS = 10_000


def _ensure_logging() -> None:
    """The reader runs in Spark-managed Python processes with no logging setup: log to stderr."""
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _opt(options, *names, default=None):
    """Spark lower-cases option keys on some paths; accept any case."""
    lowered = {str(k).lower(): v for k, v in dict(options).items()}
    for name in names:
        if name.lower() in lowered and lowered[name.lower()] not in (None, ""):
            return lowered[name.lower()]
    return default


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    topics: tuple[str, ...]
    pattern: str | None
    starting: str
    max_rows: int | None
    poll_timeout_s: float
    client_id: str
    client_conf: tuple = ()  # extra kafka-python settings from kafka.<property> options


    @classmethod
    def parse(cls, options) -> "SourceOptions":
        bootstrap = _opt(options, "kafka.bootstrap.servers", "bootstrap.servers")
        if not bootstrap:
            raise ValueError("the mqtt_kafka source needs option kafka.bootstrap.servers (HOST:PORT)")
        subscribe = _opt(options, "subscribe", default="")
        pattern = _opt(options, "subscribePattern")
        topics = tuple(t.strip() for t in subscribe.split(",") if t.strip())
        if bool(topics) == bool(pattern):
            raise ValueError("the mqtt_kafka source needs exactly one of the options "
                             "subscribe (comma-separated topics) or subscribePattern (a regex)")
        starting = str(_opt(options, "startingOffsets", default="earliest")).lower()
        if starting not in ("earliest", "latest"):
            raise ValueError(f"startingOffsets must be 'earliest' or 'latest', not {starting!r}")
        max_rows = _opt(options, "maxOffsetsPerTrigger")
        max_rows = int(max_rows) if max_rows not in (None, "") else None
        if max_rows is not None and max_rows <= 0:
            raise ValueError("maxOffsetsPerTrigger must be a positive number of records")
        return cls(bootstrap=bootstrap, topics=topics, pattern=pattern, starting=starting,
                   max_rows=max_rows,
                   poll_timeout_s=float(_opt(options, "kafkaConsumer.pollTimeoutMs",
                                             default="120000")) / 1000.0,
                   client_id=_opt(options, "kafka.client.id", default="mqtt-history"),
                   client_conf=_client_conf(options))


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Records [start, end) of one Kafka partition."""
    topic: str
    partition: int
    start: int
    end: int
    reset: bool = False  # read from the beginning of a new log (offsets went backwards)


def _client_conf(options) -> tuple:
    """kafka.<property> options that kafka-python's consumer understands (security.protocol ->
    security_protocol, ssl.cafile -> ssl_cafile, sasl.plain.username, ...); others (Java-only
    ones such as ssl.truststore.location) are for Spark's connector and skipped here."""
    from kafka import KafkaConsumer
    known = KafkaConsumer.DEFAULT_CONFIG
    out = []
    for key, value in dict(options).items():
        key = str(key).lower()
        if not key.startswith("kafka.") or key in ("kafka.bootstrap.servers", "kafka.client.id"):
            continue
        name = key[len("kafka."):].replace(".", "_")
        if name not in known:
            continue
        default = known[name]
        if isinstance(default, bool):
            value = str(value).lower() in ("1", "true", "yes")
        elif isinstance(default, int) and str(value).lstrip("-").isdigit():
            value = int(value)
        out.append((name, value))
    return tuple(sorted(out))


def _consumer(opts: SourceOptions, **extra):
    from kafka import KafkaConsumer
    from kafka.errors import KafkaTimeoutError
    conf = dict(bootstrap_servers=opts.bootstrap.split(","), group_id=None,
                enable_auto_commit=False, auto_offset_reset="none", client_id=opts.client_id,
                request_timeout_ms=30_000)
    conf.update(dict(opts.client_conf))
    conf.update(extra)
    try:
        return KafkaConsumer(**conf)
    except KafkaTimeoutError as exc:  # "Unable to bootstrap from ..." 
        raise ConnectionError(
            f"cannot reach Kafka at {opts.bootstrap}: is it running? Set the address with "
            "--kafka-bootstrap or [sink] bootstrap_servers") from exc


class KafkaPythonSource(DataSource):
    """Spark data source ``mqtt_kafka``: Kafka records as rows of sink.schema.KAFKA_SCHEMA."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self):
        return KAFKA_SCHEMA

    def streamReader(self, schema):
        return KafkaStreamReader(SourceOptions.parse(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    # Planning methods (initialOffset/latestOffset/partitions) run in one long-lived Python
    # process beside the driver, so the reader may keep state between calls (the AvailableNow
    # target, the latest offsets for progress reports). read() runs in executors.

    def __init__(self, opts: SourceOptions):
        _ensure_logging()
        self.opts = opts
        self._target = None         # Trigger.AvailableNow target offsets
        self._latest = None         # last observed latest offsets (for progress reporting)
        self._warned: set = set()

    # ---- driver side ---------------------------------------------------------------------

    def _topics(self, consumer) -> list[str]:
        if self.opts.pattern:
            rx = re.compile(self.opts.pattern)
            return sorted(t for t in consumer.topics() if rx.fullmatch(t))
        return list(self.opts.topics)

    def _snapshot(self) -> dict:
        """Current end of every partition: {"t": {topic: {p: high_watermark}}, "ids": {...}}."""
        from kafka import TopicPartition
        # A fresh client each time: fresh metadata (partitions, topic ids) and no stale
        # connections after a broker restart. Costs a few ms per trigger.
        c = _consumer(self.opts, fetch_max_wait_ms=10, max_partition_fetch_bytes=1024)
        try:
            tps, ids = [], {}
            for topic in self._topics(c):
                parts = c.partitions_for_topic(topic)
                if not parts:
                    continue  # topic does not exist (yet); it appears at its first record
                tps += [TopicPartition(topic, p) for p in sorted(parts)]
                ids[topic] = _topic_id(c, topic)
            ends = self._high_watermarks(c, tps)
        finally:
            c.close(autocommit=False)
        out: dict = {"t": {}, "ids": ids}
        for tp, off in ends.items():
            out["t"].setdefault(tp.topic, {})[str(tp.partition)] = off
        return out

    def _high_watermarks(self, c, tps) -> dict:
        """End offsets from a Fetch response (ListOffsets under-reports on Tansu)."""
        from kafka.errors import OffsetOutOfRangeError
        if not tps:
            return {}
        listed = c.end_offsets(tps)
        c.assign(tps)  # new partition state: highwater() is None until fetched
        for tp in tps:
            c.seek(tp, listed[tp])
        deadline, out_of_range = time.monotonic() + 10, False
        while time.monotonic() < deadline:
            try:
                c.poll(timeout_ms=100)
            except OffsetOutOfRangeError:
                out_of_range = True  # real Kafka: ListOffsets is exact there, keep its answer
                break
            if all(c.highwater(tp) is not None for tp in tps):
                break
        missing = [tp for tp in tps if c.highwater(tp) is None]
        if missing and not out_of_range:
            # Never fall back to ListOffsets here: on Tansu it under-reports, which would look
            # like offsets going backwards.
            raise TimeoutError(f"Kafka sent no high watermark for {missing} within 10s")
        return {tp: max(listed[tp], c.highwater(tp) or 0) for tp in tps}

    def initialOffset(self) -> dict:
        snap = self._snapshot()
        if self.opts.starting == "earliest":
            snap["t"] = {t: {p: 0 for p in parts} for t, parts in snap["t"].items()}
        log.info("starting offsets (%s): %s", self.opts.starting, json.dumps(snap["t"]))
        return snap

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.opts.max_rows) if self.opts.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._snapshot()
        log.info("available-now: reading up to %s", json.dumps(self._target["t"]))

    def reportLatestOffset(self):
        return self._latest

    def latestOffset(self, start: dict, limit) -> dict:
        try:
            snap = self._snapshot()
        except Exception as exc:  # Kafka down or restarting: no new data this trigger
            log.warning("cannot read Kafka offsets from %s (%s); will retry at the next trigger",
                        self.opts.bootstrap, exc)
            return start
        self._latest = snap
        if self._target is not None:  # AvailableNow: never go past the target
            snap = _cap(snap, self._target)
        end = {"t": {}, "ids": dict(start.get("ids", {}))}
        # Topics that vanished (e.g. Tansu restarted, not re-created yet): keep their offsets.
        for topic, parts in start.get("t", {}).items():
            if topic not in snap["t"]:
                end["t"][topic] = dict(parts)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        ranges = []  # (topic, p, from, latest, committed start)
        for topic, parts in snap["t"].items():
            new_id = snap["ids"].get(topic, "")
            old_id = start.get("ids", {}).get(topic, "")
            recreated = bool(old_id and new_id and old_id != new_id)
            old_parts = start.get("t", {}).get(topic, {})
            if recreated:
                self._warn_once(("id", topic, new_id),
                                "Kafka topic %s was re-created (topic id %s -> %s; e.g. the "
                                "embedded Kafka restarted and lost its data): offsets went "
                                "backwards, reading it again from offset 0", topic, old_id, new_id)
            end["ids"][topic] = new_id or old_id
            end["t"][topic] = {}
            for p, latest in parts.items():
                s = old_parts.get(p)
                if recreated or s is None:
                    frm = 0
                elif latest < s:
                    self._warn_once(("off", topic, p, latest),
                                    "Kafka offsets went backwards for %s-%s (committed %d, log now "
                                    "ends at %d; the embedded Kafka restarted?): reading the new "
                                    "log from offset 0", topic, p, s, latest)
                    frm = 0
                else:
                    frm = s
                ranges.append((topic, p, frm, latest, s))
        take = _allocate([(latest - frm) for _, _, frm, latest, _ in ranges], budget)
        for (topic, p, frm, _latest, _s), n in zip(ranges, take):
            end["t"][topic][p] = frm + n
        return end

    def _warn_once(self, key, msg, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def partitions(self, start: dict, end: dict):
        out = []
        for topic, parts in end.get("t", {}).items():
            s_parts = start.get("t", {}).get(topic, {})
            s_id, e_id = start.get("ids", {}).get(topic, ""), end.get("ids", {}).get(topic, "")
            recreated = bool(s_id and e_id and s_id != e_id)
            for p, e in parts.items():
                s = s_parts.get(p)
                reset = recreated or s is None or e < s
                frm = 0 if reset else s
                if e > frm:
                    out.append(KafkaRange(topic, int(p), frm, e, reset))
        return out

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        pass

    # ---- executor side --------------------------------------------------------------------

    def read(self, partition: KafkaRange) -> Iterator:
        import pyarrow as pa
        from kafka import TopicPartition
        from kafka.errors import OffsetOutOfRangeError
        from pyspark.sql.pandas.types import to_arrow_schema

        _ensure_logging()
        schema = to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")
        tp = TopicPartition(partition.topic, partition.partition)
        c = _consumer(self.opts, max_poll_records=ARROW_BATCH_ROWS, fetch_max_wait_ms=100,
                      max_partition_fetch_bytes=4 * 1024 * 1024)
        cols = _Columns()
        try:
            c.assign([tp])
            c.seek(tp, partition.start)
            pos, idle_since = partition.start, time.monotonic()
            while pos < partition.end:
                try:
                    batch = c.poll(timeout_ms=500).get(tp, [])
                except OffsetOutOfRangeError:
                    first = c.beginning_offsets([tp])[tp]
                    if pos < first:  # deleted by retention before we read it
                        log.warning("%s: records %d..%d were deleted by Kafka before being read",
                                    tp, pos, first - 1)
                        c.seek(tp, first)
                        pos = first
                        continue
                    log.warning("%s: offset %d is past the end of the log (log reset?); "
                                "stopping this range early", tp, pos)
                    break
                for rec in batch:
                    if rec.offset >= partition.end:
                        break
                    cols.add(rec)
                pos = c.position(tp)
                if batch:
                    idle_since = time.monotonic()
                    if len(cols) >= ARROW_BATCH_ROWS:
                        yield cols.to_batch(schema, pa)
                        cols = _Columns()
                    continue
                hw = c.highwater(tp)
                if hw is not None and hw <= pos:
                    log.warning("%s: log ends at %d, before the planned end %d (log reset?); "
                                "stopping this range early", tp, hw, partition.end)
                    break
                if time.monotonic() - idle_since > self.opts.poll_timeout_s:
                    raise TimeoutError(f"no records from Kafka {tp} at offset {pos} for "
                                       f"{self.opts.poll_timeout_s:.0f}s (is {self.opts.bootstrap} up?)")
        finally:
            c.close(autocommit=False)
        if len(cols):
            yield cols.to_batch(schema, pa)


def _topic_id(consumer, topic: str) -> str:
    """Kafka's topic id (a new one when a topic is re-created, or Tansu restarts), or "".

    kafka-python 3.0 keeps it, from Metadata v10+ responses, in its cluster metadata; this is
    not public API, so anything unexpected just disables the check (the offset comparison
    still detects a reset log once its end is below the committed offset)."""
    try:
        tid = consumer._client.cluster.topic_id(topic)
    except Exception:
        return ""
    return str(tid) if tid else ""


def _cap(snap: dict, target: dict) -> dict:
    """``snap`` limited to the AvailableNow ``target``: topics whose log changed since the
    target was taken are left out (their committed offsets are kept), partitions that appeared
    since are capped at 0."""
    out = {"t": {}, "ids": {}}
    for topic, parts in snap["t"].items():
        if topic not in target["t"] or target["ids"].get(topic, "") != snap["ids"].get(topic, ""):
            continue
        tparts = target["t"][topic]
        out["t"][topic] = {p: min(off, tparts.get(p, 0)) for p, off in parts.items()}
        out["ids"][topic] = snap["ids"].get(topic, "")
    return out


def _allocate(available: list[int], budget: int | None) -> list[int]:
    """Share a row budget over partitions (proportionally, at least 1 each while it lasts)."""
    available = [max(0, a) for a in available]
    total = sum(available)
    if budget is None or total <= budget:
        return available
    take = [min(a, max(1, a * budget // total)) if a else 0 for a in available]
    over = sum(take) - budget
    i = 0
    while over > 0 and any(take):
        if take[i % len(take)] > 0:
            take[i % len(take)] -= 1
            over -= 1
        i += 1
    return take


class _Columns:
    __slots__ = ("key", "value", "topic", "partition", "offset", "ts", "ts_type", "headers")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, [])

    def __len__(self) -> int:
        return len(self.offset)

    def add(self, rec) -> None:
        self.key.append(rec.key)
        self.value.append(rec.value)
        self.topic.append(rec.topic)
        self.partition.append(rec.partition)
        self.offset.append(rec.offset)
        self.ts.append(rec.timestamp * 1000 if rec.timestamp is not None and rec.timestamp >= 0
                       else None)
        self.ts_type.append(rec.timestamp_type)
        self.headers.append([{"key": k, "value": v} for k, v in (rec.headers or [])])

    def to_batch(self, schema, pa):
        arrays = [pa.array(self.key, type=schema.field("key").type),
                  pa.array(self.value, type=schema.field("value").type),
                  pa.array(self.topic, type=schema.field("topic").type),
                  pa.array(self.partition, type=schema.field("partition").type),
                  pa.array(self.offset, type=schema.field("offset").type),
                  pa.array(self.ts, type=pa.int64()).cast(schema.field("timestamp").type),
                  pa.array(self.ts_type, type=schema.field("timestampType").type),
                  pa.array(self.headers, type=schema.field("headers").type)]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
