"""Every accepted message into Kafka, and Kafka into the Spark history table. Two programs:

- sink/forward/  the broker side: Sink (in the broker process: spool writer, durable acks),
                 the forwarder process (spool -> Kafka), record encoding, embedded Kafka (Tansu)
- sink/history/  the Spark side: the history job, its Kafka source and de-duplication, queries
- shared leaves: headers.py (the record contract's header names), recordbatch.py (Kafka v2
  record batches), progress.py (what the table has committed: written by the job, read by
  the forwarder)
- job.py, query.py: the commands ``python -m sink.job`` / ``python -m sink.query``
"""
