"""History replay over MQTT (docs/history.md "Replay over MQTT"): SUBSCRIBE "$replay/<from>[..<to>]/<filter>".

in the broker process:
spec.py     the syntax of the filter (sans-I/O)
feed.py     the session's feed and the live tap: order, flow control, the switch to live (sans-I/O)
hook.py     the broker hook (the core's "replay" capability) and the worker process's control

in the replay worker (``python -m sink.replay.worker``, a child of the broker per replay reading
history; it reads the table with sink/history/reader.py, without Spark):
worker.py   the child process: the history table's rows, then Kafka's records (tail.py)
tail.py     the Kafka part

in both:
records.py  a replayed message between the two, and the frames that carry them
"""
