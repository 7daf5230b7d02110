"""The floor for connection setup: a bare uvloop server that answers CONNECT with a CONNACK and
closes on DISCONNECT, no MQTT logic. A script, not a test.

    .venv/bin/python bench/bench.py --scenarios conns --repeats 3 --only ours \
        --broker-cmd "{python} bench/uvloop_floor.py {port}"

The broker CPU per connect and per close it gets is what uvloop and the kernel cost; the
broker's own figures minus these are what its Python costs per connection (2026-11-23 on the
2-core machine, before the warm-up round and eventloop.py: 34 + 20 us here, 48-56 + 24-28 us
ours, 46 + 18-20 us Mosquitto 2.0.11). It runs uvloop as the broker does (install_uvloop).
"""
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from broker.transport.eventloop import install_uvloop  # noqa: E402

CONNACK = b"\x20\x02\x00\x00"  # 3.1.1, session not present, accepted


class Floor(asyncio.Protocol):
    __slots__ = ("transport",)  # the least a protocol can hold: the floor of memory per connection too

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        if data[:1] == b"\x10":
            self.transport.write(CONNACK)
        elif data[:1] == b"\xe0":
            self.transport.close()


async def main(port: int) -> None:
    await asyncio.get_running_loop().create_server(Floor, "127.0.0.1", port, backlog=4096)
    await asyncio.Event().wait()


if __name__ == "__main__":
    install_uvloop()  # uvloop as the broker runs it (its transport table, eventloop.py)
    asyncio.run(main(int(sys.argv[1])))
