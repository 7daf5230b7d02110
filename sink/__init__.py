"""Every accepted message into Kafka, and Kafka into the Spark history table.

Which process runs which module (each package's ``__init__`` says it again for its own):

- the broker (``python -m broker``): sink/forward/ hook.py, service.py and spool.py's writer
  (accepted messages into the spool, durable acks); sink/replay/ hook.py, feed.py, spec.py
  ($replay subscriptions, fed to their sessions)
- the forwarder (``python -m sink.forward.forwarder``, a child the broker's Sink starts; with
  ``[sink] forwarder = "thread"`` the same code in a thread of the broker): sink/forward/
  forwarder.py, sources.py (spool.py's reader), loss.py, commit_watch.py
- the replay worker (``python -m sink.replay.worker``, a child per replay reading history):
  sink/replay/ worker.py, tail.py; the table and Kafka's records without Spark: sink/history/
  reader.py, manifest.py, dedup.py, verify.py
- the history job (``python -m sink.job``): the Spark driver runs sink/history/ (job/ and the
  modules it uses); Spark's Python workers run the reading side of sink/history/source.py,
  with verify.py and dedup.py's TaskFilter

Contracts between two of them, imported by both (one writes, the other reads):

- sink/history/commits.py: what the table has committed, written by the job after each
  micro-batch, read by the forwarder (keep_until = "history"), the replay worker and
  sink.query; and the job's status file (which table it writes)
- sink/forward/spool.py: the spool's files (the broker writes, the forwarder reads)
- sink/replay/records.py: the frames the replay worker streams to the broker
- settings/history_columns.py: the table's column names, which the broker's dashboard asks for

Commands, each a few lines over its package: job.py (``python -m sink.job``), query.py
(``python -m sink.query``, sink/history/query.py), maintain.py (``python -m sink.maintain``).
"""
