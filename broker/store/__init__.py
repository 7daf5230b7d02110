"""Persistent state: sessions, subscriptions, queued/in-flight messages, retained messages."""
