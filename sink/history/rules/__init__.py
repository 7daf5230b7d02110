"""Continuous rules in the history job (settings/rules.py, docs/rules.md "How the job runs rules").

One concern a module: rowjson.py (a result row as a JSON object), supervise.py (which rules to
start, stop and retry: no Spark, a clock given), publish.py (the MQTT client that publishes QoS 1
through the broker as ``$rules``), query.py (one rule's streaming query), runner.py (the thread
that watches the store, runs the queries and writes the status file).
"""
