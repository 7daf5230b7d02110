"""A Kafka streaming source for Spark written with PySpark's Python Data Source API.

Used when Spark's own connector (spark-sql-kafka-0-10) is not on the classpath; it returns
exactly the rows of the native source with ``includeHeaders=true`` (sink.history.schema.KAFKA_SCHEMA)
and understands the same option names:

    spark.dataSource.register(KafkaPythonSource)
    spark.readStream.format("mqtt_kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9092")
        .option("subscribe", "mqtt.messages")          # comma list, or subscribePattern=<regex>
        .option("startingOffsets", "earliest")         # or latest
        .option("maxOffsetsPerTrigger", "100000")      # optional admission control
        .option("headers", "columns")                  # optional: see below
        .load()

``headers=columns`` (what sink.job uses) returns sink.history.schema.HEADER_COLUMNS_SCHEMA instead: the
contract headers already picked out as columns, which spares Spark a per-row search of the
headers array (most of the job's CPU otherwise).

How it works
- Offsets are JSON: ``{"t": {topic: {partition: next_offset}}, "ids": {topic: topic_id}}``.
  The end offset of a micro-batch is planned on the driver (``latestOffset``); executors read
  ``[start, end)`` of each partition, one InputPartition per Kafka partition range. Reading
  sends Fetch requests through kafka-python's client and decodes the record batches with
  kafka_client.recordbatch (numpy over all records at once, no Python object per record) straight into
  Arrow record batches, one per Fetch response.
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

import dataclasses
import json
import logging
import re
import sys
import time
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Hashable, Iterator, Mapping

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from sink.history.schema import HEADER_COLUMNS_SCHEMA, KAFKA_SCHEMA

if TYPE_CHECKING:
    import numpy as np

    from kafka_client.recordbatch import Decoded
    from sink.history.dedup import TaskFilter
    from sink.history.verify import Verdicts

    SignatureCheck = tuple[bytes, bytes, Verdicts]   # (derived key, key id, Verdicts)

log = logging.getLogger(__name__)

FORMAT_NAME = "mqtt_kafka"


def _ensure_logging() -> None:
    """The reader runs in Spark-managed Python processes with no logging setup: log to stderr."""
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _opt(options: Mapping[str, Any], *names: str, default: Any = None) -> Any:
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
    columns: bool = False    # headers="columns": HEADER_COLUMNS_SCHEMA instead of KAFKA_SCHEMA
    max_partitions: int | None = None  # Spark tasks per micro-batch at most (None: one per range)
    dedup_dir: str | None = None       # drop duplicate message ids, state here (sink.history.dedup)
    dedup_window_ms: int = 24 * 3600 * 1000
    dedup_max_groups: int = 100_000
    verify_dir: str | None = None      # drop records without the broker's signature (its data dir)
    embedded: bool = False             # the broker's embedded Kafka: starting empty is routine

    @property
    def check_crcs(self) -> bool:
        return dict(self.client_conf).get("check_crcs", True)

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> "SourceOptions":
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
        headers = str(_opt(options, "headers", default="array")).lower()
        if headers not in ("array", "columns"):
            raise ValueError(f"headers must be 'array' (Kafka rows, as Spark's connector) or "
                             f"'columns' (sink.history.schema.HEADER_COLUMNS_SCHEMA), not {headers!r}")
        max_parts = _opt(options, "maxPartitions")
        max_parts = int(max_parts) if max_parts not in (None, "") else None
        if max_parts is not None and max_parts <= 0:
            raise ValueError("maxPartitions must be a positive number of Spark tasks")
        window = int(_opt(options, "dedup.windowMs", default=str(24 * 3600 * 1000)))
        max_groups = int(_opt(options, "dedup.maxGroups", default="100000"))
        if window <= 0 or max_groups <= 0:
            raise ValueError("dedup.windowMs and dedup.maxGroups must be positive")
        max_rows = _opt(options, "maxOffsetsPerTrigger")
        max_rows = int(max_rows) if max_rows not in (None, "") else None
        if max_rows is not None and max_rows <= 0:
            raise ValueError("maxOffsetsPerTrigger must be a positive number of records")
        return cls(bootstrap=bootstrap, topics=topics, pattern=pattern, starting=starting,
                   max_rows=max_rows,
                   poll_timeout_s=float(_opt(options, "kafkaConsumer.pollTimeoutMs",
                                             default="120000")) / 1000.0,
                   client_id=_opt(options, "kafka.client.id", default="mqtt-history"),
                   client_conf=_client_conf(options), columns=headers == "columns",
                   max_partitions=max_parts, dedup_dir=_opt(options, "dedup.dir"),
                   dedup_window_ms=window, dedup_max_groups=max_groups,
                   verify_dir=_opt(options, "verify.dataDir"),
                   embedded=str(_opt(options, "embeddedKafka", default="false")).lower() == "true")


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Records [start, end) of one Kafka partition."""
    topic: str
    partition: int
    start: int
    end: int
    reset: bool = False  # read from the beginning of a new log (offsets went backwards)
    ingested_ms: int = 0  # the micro-batch's ingest time (from its end offset)
    ledger: str = ""      # de-duplication: the ids seen before this batch (sink.history.dedup)
    batch_dir: str = ""   # where the task writes the ids it kept


@dataclass(frozen=True)
class KafkaRanges(InputPartition):
    """Several ranges read one after the other by one Spark task: each task has a fixed cost
    (in the JVM and in the Python worker), so a micro-batch needs no more tasks than cores."""
    ranges: tuple


def _group(ranges: list, max_tasks: int | None) -> list:
    """At most ``max_tasks`` InputPartitions: ranges shared out by record count (largest
    first, to the least loaded task)."""
    if not max_tasks or len(ranges) <= max_tasks:
        return ranges
    tasks: list[list[Any]] = [[0, []] for _ in range(max_tasks)]  # [records, ranges]
    for r in sorted(ranges, key=lambda r: r.end - r.start, reverse=True):
        task = min(tasks, key=lambda t: t[0])
        task[0] += r.end - r.start
        task[1].append(r)
    return [KafkaRanges(tuple(sorted(rs, key=lambda r: (r.topic, r.partition))))
            for _, rs in tasks if rs]


def _client_conf(options: Mapping[str, Any]) -> tuple:
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


def _consumer(opts: SourceOptions, **extra: Any) -> Any:  # a kafka.KafkaConsumer
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
    """Spark data source ``mqtt_kafka``: Kafka records as rows of sink.history.schema.KAFKA_SCHEMA."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return HEADER_COLUMNS_SCHEMA if SourceOptions.parse(self.options).columns else KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(SourceOptions.parse(self.options), schema)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    # Planning methods (initialOffset/latestOffset/partitions) run in one long-lived Python
    # process beside the driver, so the reader may keep state between calls (the AvailableNow
    # target, the latest offsets for progress reports). read() runs in executors.

    def __init__(self, opts: SourceOptions, schema: StructType | None = None) -> None:
        _ensure_logging()
        self.opts = opts
        self.schema = schema or (HEADER_COLUMNS_SCHEMA if opts.columns else KAFKA_SCHEMA)
        self._target: dict | None = None   # Trigger.AvailableNow target offsets
        self._latest: dict | None = None   # last observed latest offsets (for progress reporting)
        # initialOffset's answer, given again each time Spark asks (it asks more than once for
        # a new query: a later snapshot as the first batch's start would be past its end, which
        # reads as "offsets went backwards" and read every partition from 0)
        self._initial: dict | None = None
        self._warned: set = set()
        self._down_since: float | None = None   # Kafka not answering since (monotonic)
        self._dedup = None
        if opts.dedup_dir:
            from sink.history.dedup import LedgerStore
            self._dedup = LedgerStore(opts.dedup_dir, opts.dedup_window_ms, opts.dedup_max_groups)

    # ---- driver side ---------------------------------------------------------------------

    def _topics(self, consumer: Any) -> list[str]:
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

    def _high_watermarks(self, c: Any, tps: list[Any]) -> dict:
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
        if self._initial is None:
            snap = self._snapshot()
            if self.opts.starting == "earliest":
                snap["t"] = {t: {p: 0 for p in parts} for t, parts in snap["t"].items()}
            log.info("starting offsets (%s): %s", self.opts.starting, json.dumps(snap["t"]))
            self._initial = snap
        return json.loads(json.dumps(self._initial))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_rows) if self.opts.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._snapshot()
        log.info("available-now: reading up to %s", json.dumps(self._target["t"]))

    def reportLatestOffset(self) -> dict | None:
        return self._latest

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        try:
            snap = self._snapshot()
        except Exception as exc:  # Kafka down or restarting: no new data this trigger
            # a restart takes seconds: said once; a WARNING only if it lasts
            now = time.monotonic()
            if self._down_since is None:
                self._down_since = now
                log.info("Kafka at %s does not answer (%s); retrying at every trigger",
                         self.opts.bootstrap, exc)
            elif now - self._down_since > 30 and ("down", self._down_since) not in self._warned:
                self._warned.add(("down", self._down_since))
                log.warning("Kafka at %s has not answered for %.0f s (%s); still retrying",
                            self.opts.bootstrap, now - self._down_since, exc)
            return start
        if self._down_since is not None:
            log.info("Kafka at %s answers again after %.0f s", self.opts.bootstrap,
                     time.monotonic() - self._down_since)
            self._down_since = None
        self._latest = snap
        if self._target is not None:  # AvailableNow: never go past the target
            snap = _cap(snap, self._target)
        end: dict[str, Any] = {"t": {}, "ids": dict(start.get("ids", {}))}
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
        if end["t"] == start.get("t", {}) and end["ids"] == start.get("ids", {}):
            return start  # nothing new: no micro-batch
        # The micro-batch's ingest time travels with its offsets (the offset log), so a replayed
        # batch stamps the same ingested_at; and no per-batch constant in Spark's generated code.
        end["ts"] = int(time.time() * 1000)
        return end

    def _warn_once(self, key: Hashable, msg: str, *args: object) -> None:
        """Said once: an INFO with the broker's embedded Kafka, which starts empty whenever the
        broker starts it (the broker sends again what the table lacks), else a WARNING."""
        if key not in self._warned:
            self._warned.add(key)
            log.log(logging.INFO if self.opts.embedded else logging.WARNING, msg, *args)

    def partitions(self, start: dict, end: dict) -> list:
        ts = end.get("ts") or int(time.time() * 1000)  # offsets written before "ts" existed
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
                    out.append(KafkaRange(topic, int(p), frm, e, reset, ts))
        if self._dedup is not None:  # before any task runs: the ledger they filter against
            ledger, bdir = self._dedup.prepare(start, end, ts)
            out = [dataclasses.replace(r, ledger=ledger, batch_dir=bdir) for r in out]
        return _group(out, self.opts.max_partitions)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        pass

    # ---- executor side --------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator:
        """Records [start, end) of the partition's Kafka ranges, one Arrow batch per Fetch
        response."""
        import pyarrow as pa

        _ensure_logging()
        schema = self._arrow_schema()
        ranges = partition.ranges if isinstance(partition, KafkaRanges) else (partition,)
        dedup = None
        if ranges and ranges[0].ledger:
            from sink.history.dedup import TaskFilter, load_ledger
            dedup = TaskFilter(load_ledger(ranges[0].ledger))
        check = _signature_check(self.opts.verify_dir)
        for r in ranges:
            yield from self._read_range(pa, schema, r, dedup, check)
        if check is not None and check[2].dropped:
            v = check[2]
            log.warning("dropped %d Kafka records of %s that do not carry the broker's signature: "
                        "%s (first at offsets %s); [history] verify_records = false keeps them",
                        v.dropped, ", ".join(f"{r.topic}-{r.partition}" for r in ranges),
                        v.describe(), ", ".join(f"{o} ({why})" for why, o in v.examples))
        if dedup is not None:  # the ids this task kept: merged into the ledger for the next batch
            from sink.history.dedup import write_task_summary
            write_task_summary(ranges[0].batch_dir,
                               ",".join(f"{r.topic}-{r.partition}:{r.start}" for r in ranges),
                               dedup.summary())
            if dedup.dropped:
                log.info("dropped %d duplicate message ids (%s)", dedup.dropped,
                         ", ".join(f"{r.topic}-{r.partition}" for r in ranges))
        _freeze_once()

    def _arrow_schema(self) -> Any:  # a pyarrow Schema
        from pyspark.sql.pandas.types import to_arrow_schema
        return to_arrow_schema(self.schema, timezone="UTC")

    def _read_range(self, pa: ModuleType, schema: Any, partition: KafkaRange, dedup: TaskFilter | None = None,
                    check: SignatureCheck | None = None) -> Iterator:
        from kafka.errors import OffsetOutOfRangeError

        from kafka_client.gaps import HOLE_WAIT, Gaps
        fetcher = _PartitionFetcher(self.opts, partition.topic, partition.partition)
        tp = f"{partition.topic}-{partition.partition}"
        pos, idle_since = partition.start, time.monotonic()
        holes = Gaps()
        while pos < partition.end:
            try:
                d, high_watermark = fetcher.fetch(pos)
                if d is not None and d.gap is not None and d.gap[0] == pos:
                    # Kafka's answer skipped offsets: asked again from there (not lost)
                    if holes.wait(tp, d.gap):
                        time.sleep(HOLE_WAIT)
                        continue
                    d, high_watermark = fetcher.fetch(pos, past_holes=True)
            except OffsetOutOfRangeError:
                first = fetcher.beginning_offset()
                if pos < first:  # deleted by retention before we read it
                    log.warning("%s: records %d..%d were deleted by Kafka before being read",
                                tp, pos, first - 1)
                    pos = first
                    continue
                log.warning("%s: offset %d is past the end of the log (log reset?); "
                            "stopping this range early", tp, pos)
                break
            if d is not None and d.next_offset is not None and d.next_offset > pos:
                keep = (d.offset >= pos) & (d.offset < partition.end)
                pos = d.next_offset
                idle_since = time.monotonic()
                if not keep.any():
                    continue
                if not keep.all():
                    d = d.take(keep)
                if check is not None:   # before de-duplication: a forged id must not hide a real one
                    from sink.history.verify import signed
                    ok = signed(d, partition.topic, *check)
                    if not ok.all():
                        d = d.take(ok)
                        if not len(d):
                            continue
                if dedup is not None:  # ids seen before (sink.history.dedup): one take for both
                    fresh = dedup.keep(d.data, *_message_ids(d))
                    if not fresh.all():
                        d = d.take(fresh)
                if len(d):
                    yield to_arrow(pa, schema, d, partition.topic, partition.partition,
                                   self.opts.columns, partition.ingested_ms)
                continue
            if high_watermark is not None and 0 <= high_watermark <= pos:
                log.warning("%s: log ends at %d, before the planned end %d (log reset?); "
                            "stopping this range early", tp, high_watermark, partition.end)
                break
            if time.monotonic() - idle_since > self.opts.poll_timeout_s:
                raise TimeoutError(f"no records from Kafka {tp} at offset {pos} for "
                                   f"{self.opts.poll_timeout_s:.0f}s (is {self.opts.bootstrap} up?)")


_no_key_warned: set = set()


def _signature_check(data_dir: str | None) -> SignatureCheck | None:
    """(derived key, key id, Verdicts) for sink.history.verify, from the broker's data directory;
    None when records are not checked (not asked, or the broker never made its key there)."""
    if not data_dir:
        return None
    from settings import secrets
    from sink.history.verify import Verdicts
    key = secrets.sink_key(data_dir)
    if key is None:
        if data_dir not in _no_key_warned:
            _no_key_warned.add(data_dir)
            log.warning("no broker key in %s: Kafka records are not checked for the broker's "
                        "signature (is it the broker's data directory? --data-dir / data_dir)",
                        secrets.secrets_dir(data_dir))
        return None
    return secrets.derive(key, secrets.RECORDS), secrets.key_id(key), Verdicts()


_frozen = False


def _freeze_once() -> None:
    """PySpark's daemon runs a full gc.collect() after every task of a reused Python worker;
    with numpy, pyarrow, pandas and kafka-python loaded that is ~50 ms of CPU per task, spent
    walking objects that live as long as the process. Move them out of the collector's sight
    once (gc.freeze); what later tasks create is still collected."""
    global _frozen
    if not _frozen:
        import gc
        gc.collect()
        gc.freeze()
        _frozen = True


_clients: dict = {}


class _PartitionFetcher:
    """Fetch requests for one partition through kafka-python's client (connection, security,
    metadata, API version negotiation), keeping the records as bytes: decoded by
    kafka_client.recordbatch, not record by record."""

    MAX_BYTES = 2 * 1024 * 1024

    def __init__(self, opts: SourceOptions, topic: str, partition: int) -> None:
        self.opts, self.topic, self.partition = opts, topic, partition
        self.c: Any = None   # a kafka.KafkaConsumer

    def _client(self) -> Any:
        """One kafka-python client per worker process and options, kept between tasks."""
        if self.c is None:
            self.c = _clients.get(self.opts)
            if self.c is None:
                self.c = _clients[self.opts] = _consumer(self.opts)
            if not self.c.partitions_for_topic(self.topic):  # metadata: who leads it
                from kafka.errors import UnknownTopicOrPartitionError
                raise UnknownTopicOrPartitionError(f"Kafka has no topic {self.topic}")
        return self.c

    def close(self) -> None:
        """Drop the client (after an error: the next fetch starts with a fresh one)."""
        if self.c is not None:
            _clients.pop(self.opts, None)
            self.c.close(autocommit=False)
            self.c = None

    def beginning_offset(self) -> int:
        from kafka import TopicPartition
        tp = TopicPartition(self.topic, self.partition)
        return self._client().beginning_offsets([tp])[tp]

    def fetch(self, offset: int, wait_ms: int = 500,
              past_holes: bool = False) -> tuple[Decoded | None, int | None]:
        """-> (Decoded or None, high watermark or None); the records stop where the answer
        skips offsets (Decoded.gap, kafka_client/gaps.py) unless `past_holes`. Raises
        OffsetOutOfRangeError; other errors (leader moved, connection lost, Kafka restarting)
        are retried on a new client until kafkaConsumer.pollTimeoutMs."""
        import kafka.errors as Errors
        from kafka import TopicPartition
        from kafka.protocol.consumer import FetchRequest

        from kafka_client.recordbatch import decode

        ft = FetchRequest.FetchTopic
        deadline = time.monotonic() + self.opts.poll_timeout_s
        while True:
            try:
                c = self._client()
                node = c._client.cluster.leader_for_partition(
                    TopicPartition(self.topic, self.partition))
                if node is None or node < 0:
                    raise Errors.NotLeaderForPartitionError(f"no leader for {self.topic}")
                request = FetchRequest(
                    max_wait_ms=wait_ms, min_bytes=1, max_bytes=self.MAX_BYTES, isolation_level=0,
                    session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                    topics=[ft(topic=self.topic, partitions=[ft.FetchPartition(
                        partition=self.partition, current_leader_epoch=-1, fetch_offset=offset,
                        last_fetched_epoch=-1, partition_max_bytes=self.MAX_BYTES)])],
                    min_version=0, max_version=12)
                future = c._manager.send(request, node_id=node)
                response = c._net.run(c._manager.wait_for, future, wait_ms + 30_000)
                data = response.responses[0].partitions[0]
                error = Errors.for_code(data.error_code)
                if error is Errors.OffsetOutOfRangeError:
                    raise error(f"offset {offset} of {self.topic}-{self.partition}")
                if error is not Errors.NoError:
                    raise error(f"fetch {self.topic}-{self.partition} at {offset}")
                hw = data.high_watermark
                raw = data.records
                return (decode(raw, self.opts.check_crcs, None if past_holes else offset)
                        if raw else None, hw if hw is not None and hw >= 0 else None)
            except Errors.OffsetOutOfRangeError:
                raise
            except (Errors.KafkaError, OSError) as exc:
                if not getattr(exc, "retriable", True) or time.monotonic() > deadline:
                    raise
                log.info("fetch %s-%d at %d: %s; retrying", self.topic, self.partition, offset, exc)
                self.close()
                time.sleep(0.5)


def _message_ids(d: Decoded) -> tuple:
    from kafka_client import recordbatch as rb
    from kafka_client.headers import H_MESSAGE_ID
    return rb.first_header(d, H_MESSAGE_ID.encode())


def to_arrow(pa: ModuleType, schema: Any, d: Decoded, topic: str, partition: int, columns: bool,
             ingested_ms: int = 0) -> Any:  # a pyarrow RecordBatch
    """Decoded records -> an Arrow batch of KAFKA_SCHEMA, or of HEADER_COLUMNS_SCHEMA when
    ``columns`` (the contract headers as columns and ``ingested_ms``, see sink.history.schema)."""
    import numpy as np

    from kafka_client import recordbatch as rb
    from kafka_client.headers import H_USER_PREFIX
    from sink.history.schema import HEADER_COLUMNS

    n = len(d)
    ts = d.timestamp
    no_ts = ts < 0
    arrays = [rb.binary_array(pa, d.data, *d.key), rb.binary_array(pa, d.data, *d.value),
              rb.constant_string(pa, topic, n), pa.array(np.full(n, partition, np.int32)),
              pa.array(d.offset),
              pa.array(ts * 1000, type=pa.int64(), mask=no_ts if no_ts.any() else None)
              .cast(schema.field("timestamp").type),
              pa.array(d.ts_type)]
    if not columns:
        arrays.append(_header_list(pa, schema.field("headers").type, d, d.hoff,
                                   np.ones(len(d.hkey[0]), bool), 0))
    else:
        for name, _ in HEADER_COLUMNS:
            arrays.append(rb.binary_array(pa, d.data, *rb.first_header(d, name.encode())))
        prefix = H_USER_PREFIX.encode()
        user = rb.key_matches(d, prefix, prefix=True)
        per_record = np.bincount(d.header_record()[user], minlength=n)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(per_record, out=offsets[1:])
        arrays.append(_header_list(pa, schema.field("user_headers").type, d, offsets, user,
                                   len(prefix)))
        arrays.append(pa.array(np.full(n, ingested_ms * 1000, np.int64))
                      .cast(schema.field("ingested_at").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _header_list(pa: ModuleType, type_: Any, d: Decoded, offsets: np.ndarray, mask: np.ndarray, strip: int) -> Any:
    """The headers selected by ``mask`` as list<struct<key string, value binary>>, record i
    owning entries offsets[i]:offsets[i+1]; ``strip`` bytes cut from the start of each key."""
    from kafka_client import recordbatch as rb
    ks, kl = d.hkey[0][mask] + strip, d.hkey[1][mask] - strip
    keys = rb.binary_array(pa, d.data, ks, kl, pa.string())
    values = rb.binary_array(pa, d.data, d.hvalue[0][mask], d.hvalue[1][mask])
    entries = pa.StructArray.from_arrays([keys, values], fields=list(type_.value_type))
    return pa.ListArray.from_arrays(pa.array(offsets.astype("int32")), entries, type=type_)


def _topic_id(consumer: Any, topic: str) -> str:
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
    out: dict[str, dict] = {"t": {}, "ids": {}}
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
