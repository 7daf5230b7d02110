"""Sans-I/O MQTT wire format: packets, properties, reason codes, codec.

codec and properties may run compiled (mypyc, built by scripts/setup.sh); `broker.native.select`
makes sure a compiled build older than its source never runs.
"""
from .. import native

CODEC = native.select()  # 'compiled', 'pure' or 'stale' (then pure, with a warning)
