"""Prometheus metrics, a health endpoint and $SYS topics, read from the core's counters."""
