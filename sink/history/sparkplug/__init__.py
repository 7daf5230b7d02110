"""Sparkplug B (Eclipse Sparkplug 3.0) payloads in the history: the table ``sparkplug_metrics``.

- ``sparkplug_b.proto``: Eclipse Tahu's definition of the payload (EPL-2.0, header kept);
  ``sparkplug_b_pb2.py`` is generated from it (the command is in sparkplug_b_pb2.py's header);
- ``decode.py``: topic + payload -> one row per metric (pure Python, the ``protobuf`` package);
- ``aliases.py``: alias -> metric name, from the last birth of each edge node and device;
- ``table.py``: the job's writer of the table, beside ``messages``, in the same micro-batch.

All of it runs in the history job's Spark driver (the micro-batch writer reads the staged
Parquet files back without Spark); sink.query and sink.maintain use table.py too.
"""
