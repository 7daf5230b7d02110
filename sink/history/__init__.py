"""The Spark side of the sink: Kafka -> the history table, and what reads the table.

in the history job (``python -m sink.job``; Spark's driver):
    job/           the job itself (its package says module by module)
    source.py      the Python Kafka source: planning here, reading in Spark's Python workers
                   (with verify.py, the records' signatures, and dedup.py's TaskFilter)
    schema.py, writer.py, manifest.py, sparkplug/   rows, the micro-batch writer, the commit log
    compaction.py, retention.py, maintenance.py     upkeep (also ``python -m sink.maintain``)
    spark.py, catalog.py, thrift.py, guard.py       its session, the catalog, JDBC, the
                                                    read-only guard of the query endpoints
    commits.py     what the table has committed: written here, read by the forwarder
                   (sink/forward/commit_watch.py), the replay worker and sink.query

in the replay worker (``python -m sink.replay.worker``, a child of the broker; no Spark):
    reader.py, manifest.py, dedup.py, verify.py, commits.py

in the command ``python -m sink.query`` (its own Spark session or the job's Spark Connect):
    query.py, spark.py, commits.py (which job runs)

paths.py: plain path helpers any of them use.
"""
