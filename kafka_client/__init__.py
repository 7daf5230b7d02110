"""Kafka code the sink and the cluster share (a leaf: it imports nothing of the project).

headers.py      the record contract's header names (docs/history.md "Kafka record schema")
record.py       the record contract (SinkRecord, to_kafka / from_kafka), Kafka v2 record bodies and
                RecordBatches, the spool's entries of pre-encoded records
recordbatch.py  fetched RecordBatches decoded as columns (numpy): the history job, the replay
recordscan.py   fetched RecordBatches read keys first, record by record: the cluster's stream
produce.py      ProduceRequests of pre-encoded records through kafka-python's network client
fetch.py        Fetch requests for many partitions, decoded by recordbatch or recordscan
embedded.py     the embedded Kafka (Tansu) a broker starts with --sink
ports.py        who holds a TCP port (for the errors that say so)
"""
