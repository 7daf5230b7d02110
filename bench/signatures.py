"""CPU cost of the broker's record signatures (kafka_client/headers.py H_SIG): the forwarder signs each
record body (kafka_client/record.py sign_body), the history job checks them on the decoded Fetch
bytes (sink/history/verify.py). CPU time of this process (time.process_time), so a busy machine
changes the figures less than wall-clock would.

    .venv/bin/python bench/signatures.py [--records N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kafka_client.headers import signature_mac  # noqa: E402
from kafka_client.record import build_batch, encode_message, entry_fields, sign_body  # noqa: E402
from kafka_client.recordbatch import decode  # noqa: E402
from settings import secrets  # noqa: E402
from sink.history.verify import Verdicts, signed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20000)
    n = ap.parse_args().records
    key = secrets.derive(b"k" * 32, secrets.RECORDS)
    kid = secrets.key_id(b"k" * 32)
    entries = [entry_fields(encode_message("mqtt.messages", f"sensors/dev-{i % 100}/temp", b"21.5", 1,
                                           False, f"dev-{i % 100}", None, 5, 1_800_000_000_000 + i,
                                           f"65f0a1b2c3d4-{i:x}")) for i in range(n)]
    best_sign = best_verify = float("inf")
    for _ in range(5):
        t = time.process_time()
        keyed = signature_mac(key)
        out = [(ts, sign_body(body, kt, ts, keyed, kid)) for kt, ts, body in entries]
        best_sign = min(best_sign, time.process_time() - t)
        d = decode(b"".join(build_batch(out[i:i + 2000]) for i in range(0, n, 2000)))
        t = time.process_time()
        ok = signed(d, "mqtt.messages", key, kid, Verdicts())
        best_verify = min(best_verify, time.process_time() - t)
        assert ok.all()
    print(f"sign (forwarder):  {best_sign / n * 1e6:.2f} us CPU per record "
          f"({best_sign / n * 25000 * 100:.1f}% of a core at 25,000 msg/s)")
    print(f"verify (job task): {best_verify / n * 1e6:.2f} us CPU per record "
          f"({best_verify / n * 25000 * 100:.1f}% of a core at 25,000 msg/s)")


if __name__ == "__main__":
    main()
