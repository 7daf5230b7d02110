"""Sans-I/O broker core: topics, retained store, sessions, router, connection state."""
