"""The broker side of the sink: accepted messages -> the spool -> Kafka. Two processes:

in the broker process (``python -m broker``):
    hook.py        SinkHook: the broker hook taking accepted messages (made by Sink.hook())
    service.py     Sink: the spool writer, durability barriers, stats; starts the forwarder
    spool.py       the spool's files: SpoolWriter (group commit, fsync) here, the reading there

in the forwarder process (``python -m sink.forward.forwarder``, started by service.py; with
``[sink] forwarder = "thread"`` a thread of the broker runs the same code):
    forwarder.py   Forwarder: spool -> Kafka, a state machine (State, step) off the broker's loop
    sources.py     where it reads: the spool (with its checkpoint) or memory
    loss.py        noticing that Kafka lost data
    commit_watch.py  keep_until = "history": the history job's commits (sink/history/commits.py)
"""
