"""MQTT 3.1 / 3.1.1 / 5.0 broker: a sans-I/O core (protocol/, core/) under a thin asyncio server."""
__version__ = "0.1.0"
