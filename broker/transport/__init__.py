"""Listeners: plain TCP (in server.py), TLS contexts, MQTT over WebSockets."""
