"""Container health check. Exit 0 = healthy, 1 = not.

    python deploy/healthcheck.py [HOST] [PORT]     the broker answers an MQTT CONNECT with a CONNACK
                                                   (default 127.0.0.1 1883, or $MQTT_BROKER_PORT)
    python deploy/healthcheck.py --tcp HOST PORT   something listens there (the job's Spark Connect)

Any CONNACK counts, including "not authorized" when anonymous clients are refused: it proves
the listener accepts connections and the event loop is serving.
"""
import os
import socket
import sys


def listening(host: str, port: int) -> int:
    try:
        socket.create_connection((host, port), timeout=4).close()
        return 0
    except OSError as exc:
        print(f"nothing listens on {host}:{port}: {exc}", file=sys.stderr)
        return 1


def connack(host: str, port: int) -> int:
    cid = f"healthcheck-{os.getpid()}".encode()
    # MQTT 3.1.1 CONNECT: protocol "MQTT" level 4, clean session, keep alive 10 s
    var = b"\x00\x04MQTT\x04\x02\x00\x0a" + len(cid).to_bytes(2, "big") + cid
    packet = bytes([0x10, len(var)]) + var
    try:
        with socket.create_connection((host, port), timeout=4) as s:
            s.sendall(packet)
            ack = b""
            while len(ack) < 4:
                chunk = s.recv(4 - len(ack))
                if not chunk:
                    break
                ack += chunk
            if len(ack) == 4 and ack[0] == 0x20 and ack[1] == 2:
                if ack[3] == 0:
                    s.sendall(b"\xe0\x00")          # DISCONNECT
                return 0
            print(f"unexpected answer {ack!r}", file=sys.stderr)
    except OSError as exc:
        print(f"cannot reach the broker at {host}:{port}: {exc}", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["--tcp"]:
        if len(argv) != 3:
            print("usage: healthcheck.py --tcp HOST PORT", file=sys.stderr)
            return 1
        return listening(argv[1], int(argv[2]))
    host = argv[0] if argv else "127.0.0.1"
    port = int(argv[1] if len(argv) > 1 else os.environ.get("MQTT_BROKER_PORT", 1883))
    return connack(host, port)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
