"""Sans-I/O broker core: topics, retained store, sessions, router, connection state.

message, router, session, connection and broker may run compiled (mypyc, built by
scripts/setup.sh); `broker.native.select` makes sure a compiled build older than its sources
never runs.
"""
from .. import native

CORE = native.select()  # 'compiled', 'pure' or 'stale' (then pure, with a warning)
