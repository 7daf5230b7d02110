"""One broker on many nodes, its shared state in Kafka (README "Cluster").

control.py  the replicated state machine of the control topic (sans-I/O): members, client-id
            ownership by log order, session records, timers of sessions whose node is gone
records.py  what goes to Kafka: message records (the sink's record contract), control records
link.py     Kafka I/O: the topics, the producer, the reader thread
node.py     the broker hook (core/hooks.py): route, barrier, admit, the persistence events
"""
