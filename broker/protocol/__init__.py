"""Sans-I/O MQTT wire format: packets, properties, reason codes, codec."""
