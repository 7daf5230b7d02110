"""The table ``sparkplug_metrics``: written by the history job beside ``messages``.

Directory ``<table>_sparkplug`` (beside ``<table>_checkpoint``), with the same commit log as
``messages`` (sink/history/manifest.py): ``spark.read.parquet(dir)`` and the catalog table read
one committed version. Written in the job's micro-batch, from the rows the batch writes to
``messages`` (its staged Parquet files, read back here without Spark: the Kafka records are not
read twice), and committed *before* them: a batch run again after a crash between the two
commits finds itself in this table, skips it and writes ``messages`` only, so each table holds
each batch once and the two agree (no Sparkplug row whose message is not in ``messages``).

Malformed payloads (on a Sparkplug B topic, not Sparkplug B) are counted: logged per batch, and
the total kept in the table's log (with the stream's last batch: ``malformed_total()``).
"""
from __future__ import annotations

import datetime as dt
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sink.history.manifest import Change, Snapshot, Table, staged_files
from sink.history.sparkplug.aliases import Aliases
from sink.history.sparkplug.batch import COLUMNS, decode_batch
from sink.history.sparkplug.decode import BIRTHS, NAMESPACE, TYPE_NAMES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

TABLE_NAME = "sparkplug_metrics"
STATE_VIEW = "sparkplug_state"
SUFFIX = "_sparkplug"
HOUR_COLUMN = "_h"
_CODES = {name: code for code, name in TYPE_NAMES.items()}


def table_path(history_table: str) -> str:
    """Where the job writes sparkplug_metrics for the history table ``history_table``."""
    return history_table.rstrip("/") + SUFFIX


def schema() -> Any:
    """The table's columns (Spark types; ``date``, the UTC day of accepted_at, partitions it)."""
    from pyspark.sql.types import (
        DateType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
        VariantType,
    )
    s, ts = StringType(), TimestampType()
    return StructType([
        StructField("group_id", s), StructField("message_type", s), StructField("edge_node_id", s),
        StructField("device_id", s), StructField("metric", s), StructField("alias", LongType()),
        StructField("datatype", s), StructField("value", VariantType()),
        StructField("metric_timestamp", ts), StructField("seq", LongType()),
        StructField("message_id", s), StructField("topic", s), StructField("accepted_at", ts),
        StructField("date", DateType())])


def file_layout() -> Any:
    """The table's files for compaction (compaction.Layout): sorted by accepted_at."""
    from pyspark.sql.types import StructType

    from sink.history.compaction import Layout
    return Layout(StructType([f for f in schema().fields if f.name != "date"]), (),
                  ("accepted_at", "message_id"))


def _arrow_rows(rows: list[tuple]) -> Any:
    """Decoded rows (batch.COLUMNS) as a pyarrow Table."""
    import pyarrow as pa
    ts = pa.timestamp("us", tz="UTC")
    types = {"alias": pa.int64(), "seq": pa.int64(), "metric_timestamp": ts, "accepted_at": ts}
    cols = list(zip(*rows)) if rows else [()] * len(COLUMNS)
    return pa.table({name: pa.array(list(col), type=types.get(name, pa.string()))
                     for name, col in zip(COLUMNS, cols)})


def read_messages(staged: Path) -> list[tuple[str, str, bytes | None, dt.datetime]]:
    """The Sparkplug B topic rows of a batch's staged ``messages`` files: (message_id, topic,
    payload, accepted_at), in accepted order (then Kafka partition and offset)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    files = [str(p) for p, _, _ in staged_files(staged)]
    if not files:
        return []
    data = ds.dataset(files, format="parquet")
    sparkplug = pc.starts_with(ds.field("topic"), NAMESPACE + "/")
    # most batches have none: the topics alone tell (the payloads are read only when some are)
    if data.count_rows(filter=sparkplug) == 0:
        return []
    t = data.to_table(columns=["message_id", "topic", "payload", "accepted_at", "kafka_partition",
                               "kafka_offset"], filter=sparkplug)
    t = t.sort_by([("accepted_at", "ascending"), ("kafka_partition", "ascending"),
                   ("kafka_offset", "ascending")])
    at = t.column("accepted_at").cast("timestamp[us]").to_pylist()
    return [(m, tp, p, a.replace(tzinfo=dt.timezone.utc))
            for m, tp, p, a in zip(t.column("message_id").to_pylist(), t.column("topic").to_pylist(),
                                   t.column("payload").to_pylist(), at)]


def load_aliases(table: Table, snap: Snapshot, max_keys: int | None = None) -> Aliases:
    """The alias maps after the table's version ``snap``: from its birth rows (at most
    ``max_keys`` edge nodes and devices: the most recently born)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    if not snap.files:
        return Aliases(max_keys=max_keys)
    data = ds.dataset([str(table.abs(f.path)) for f in snap.files], format="parquet")
    t = data.to_table(columns=["group_id", "edge_node_id", "device_id", "message_id",
                               "accepted_at", "metric", "alias", "datatype"],
                      filter=pc.is_in(ds.field("message_type"), value_set=pa.array(BIRTHS)))
    rows = t.to_pylist()
    for r in rows:
        r["datatype_code"] = _CODES.get(r.pop("datatype") or "")
    return Aliases.from_births(rows, max_keys)


def malformed_total(table: Table | Snapshot) -> int:
    """Malformed Sparkplug B payloads the job has met, in every batch it committed (kept with
    the stream's last batch in the table's log, which compaction and retention carry over)."""
    snap = table.snapshot() if isinstance(table, Table) else table
    return int((snap.stream or {}).get("malformed_total", 0))


class SparkplugWriter:
    """Called by the job's BatchWriter with each micro-batch's staged ``messages`` files."""

    def __init__(self, path: str, max_nodes: int | None = None) -> None:
        self.table = Table(path)
        self.max_nodes = max_nodes   # [history] sparkplug_max_nodes
        self.aliases: Aliases | None = None

    topic_prefix = NAMESPACE + "/"  # the rows it wants (writer.SideTable)

    def __call__(self, spark: SparkSession, staged: Path, batch_id: int, stream_id: str,
                 wanted: int | None = None) -> int:
        """Decode and commit the batch's Sparkplug B rows (unless the table has the batch
        already); `wanted`: how many rows of the batch have a Sparkplug B topic, when the
        writer counted them (0: nothing is read). Returns the rows written."""
        if wanted == 0:
            return 0
        snap = self.table.snapshot()
        if snap.stream_batch(stream_id) >= batch_id:
            return 0
        messages = read_messages(staged)
        if not messages:
            return 0
        if self.aliases is None:   # the job's first such batch: the maps of what was committed
            self.aliases = load_aliases(self.table, snap, self.max_nodes)
            if len(self.aliases):
                log.info("Sparkplug B aliases of %d edge nodes and devices read back from %s",
                         len(self.aliases), self.table.root)
        work = self.aliases.copy()
        out = decode_batch(messages, work)
        files = []
        staging = self.table.staging(f"b{batch_id}")
        try:
            if out.rows:
                df = spark.createDataFrame(_arrow_rows(out.rows)).selectExpr(
                    *["parse_json(value_json) AS value" if c == "value_json" else c
                      for c in COLUMNS],
                    "to_date(accepted_at) AS date", f"hour(accepted_at) AS {HOUR_COLUMN}")
                df.write.mode("overwrite").partitionBy("date", HOUR_COLUMN).parquet(str(staging / "out"))
                files = self.table.place(staged_files(staging / "out"), f"b{batch_id:08d}",
                                         batch_id, 0)
            total = malformed_total(snap) + len(out.malformed)
            self.table.commit(Change(
                op="append", add=files,
                stream={"id": stream_id, "batch": batch_id, "malformed_total": total},
                detail={"batch": batch_id, "rows": len(out.rows), "messages": out.messages,
                        "malformed": len(out.malformed)}))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.aliases = work
        if work.forgotten:
            log.warning("batch %d: the aliases of %d Sparkplug B edge node(s) or device(s) "
                        "forgotten, the least recently used, to keep those of %d ([history] "
                        "sparkplug_max_nodes): their DATA has metric NULL until their next birth",
                        batch_id, work.forgotten, self.max_nodes)
        if out.malformed:
            message_id, topic, why = out.malformed[0]
            log.warning("batch %d: %d malformed Sparkplug B payload(s) kept in messages only "
                        "(%d so far), e.g. message %s on %s: %s", batch_id, len(out.malformed),
                        total, message_id, topic, why)
        return len(out.rows)


# ---- views and catalog ----------------------------------------------------------------------

def state_sql(messages: str = "messages", metrics: str = TABLE_NAME) -> str:
    """``sparkplug_state``: per edge node and device, whether it is online (Sparkplug 3.0
    sections 7.1-7.4: an edge node is online from its NBIRTH to its NDEATH; a device from its
    DBIRTH to its DDEATH, and only while its edge node is, since the node's birth), its last
    birth or death, when, and the edge node's bdSeq of that birth or death. DDEATHs carry no
    metric, so the events are read from ``messages``; bdSeq from ``metrics``."""
    return f"""
WITH events AS (
  SELECT p[1] AS group_id, p[2] AS message_type, p[3] AS edge_node_id,
         try_element_at(p, 5) AS device_id, accepted_at, message_id
  FROM (SELECT split(topic, '/') AS p, accepted_at, message_id FROM {messages}
        WHERE startswith(topic, 'spBv1.0/'))
  WHERE (p[2] IN ('NBIRTH', 'NDEATH') AND size(p) = 4) OR (p[2] IN ('DBIRTH', 'DDEATH') AND size(p) = 5)
), last AS (
  SELECT group_id, edge_node_id, device_id,
         max_by(named_struct('type', message_type, 'at', accepted_at, 'id', message_id),
                struct(accepted_at, message_id)) AS e
  FROM events GROUP BY group_id, edge_node_id, device_id
), bdseq AS (
  SELECT message_id, max(try_variant_get(value, '$', 'bigint')) AS bdseq FROM {metrics}
  WHERE metric = 'bdSeq' AND message_type IN ('NBIRTH', 'NDEATH') GROUP BY message_id
)
SELECT l.group_id, l.edge_node_id, l.device_id,
       CASE WHEN l.device_id IS NULL THEN l.e.type = 'NBIRTH'
            ELSE l.e.type = 'DBIRTH' AND coalesce(n.e.type = 'NBIRTH' AND n.e.at <= l.e.at, false)
       END AS online,
       l.e.type AS last_message_type, l.e.at AS since, b.bdseq, l.e.id AS message_id
FROM last l
LEFT JOIN last n ON l.device_id IS NOT NULL AND n.device_id IS NULL
     AND n.group_id = l.group_id AND n.edge_node_id = l.edge_node_id
LEFT JOIN bdseq b ON b.message_id = coalesce(n.e.id, l.e.id)
"""


def create_sql(history_table: str, database: str, quote: Any, location: Any) -> list[str]:
    """Catalog statements: the table sparkplug_metrics (Parquet over its directory) and the
    view sparkplug_state over it and ``messages``. ``quote``: an identifier quoter;
    ``location``: the table's absolute location (catalog.py's)."""
    db = quote(database)
    cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema().fields)
    loc = location(table_path(history_table)).replace("\\", "\\\\").replace("'", "\\'")
    return [f"CREATE TABLE IF NOT EXISTS {db}.{quote(TABLE_NAME)} ({cols}) USING parquet "
            f"LOCATION '{loc}'",
            f"CREATE OR REPLACE VIEW {db}.{quote(STATE_VIEW)} AS "
            + state_sql(f"{db}.`messages`", f"{db}.{quote(TABLE_NAME)}").strip()]


def register_views(spark: SparkSession, history_table: str) -> bool:
    """Temp views ``sparkplug_metrics`` and ``sparkplug_state`` of a history table read by
    path (sink.query), beside ``messages``; False when the job has not made the table yet."""
    path = table_path(history_table)
    if "://" in path and not path.startswith("file://"):
        return False   # the job writes sparkplug_metrics beside local tables only
    if not (Path(path.removeprefix("file://")) / "_spark_metadata").is_dir():
        return False
    spark.read.schema(schema()).parquet(path).createOrReplaceTempView(TABLE_NAME)
    spark.sql(f"CREATE OR REPLACE TEMP VIEW {STATE_VIEW} AS {state_sql()}")
    return True
