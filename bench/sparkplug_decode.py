"""Decode cost per Sparkplug B message (sink/history/sparkplug/batch.py: CPU time of this
process, so that other work on the machine does not count), on the fixtures made by Eclipse
Tahu's Node encoder: an NDATA of 3 metrics by alias, a DDATA of 2, an NBIRTH of 20.

    PYTHONPATH=. .venv/bin/python bench/sparkplug_decode.py [N]
"""
from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path

from sink.history.sparkplug.aliases import Aliases
from sink.history.sparkplug.batch import decode_batch

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sparkplug"
TOPICS = {m["name"]: m["topic"] for m in json.loads((FIXTURES / "messages.json").read_text())}
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def batch(name: str, n: int) -> list:
    raw = (FIXTURES / f"{name}.bin").read_bytes()
    return [(f"m{i}", TOPICS[name], raw, T0) for i in range(n)]


def main(n: int = 20000) -> None:
    aliases = Aliases()
    decode_batch(batch("nbirth", 1) + batch("dbirth", 1), aliases)
    for name in ("ndata", "ddata", "nbirth"):
        msgs = batch(name, n)
        started = time.process_time()
        out = decode_batch(msgs, aliases.copy())
        took = time.process_time() - started
        print(f"{name}: {n} messages, {len(out.rows)} rows: {took / n * 1e6:.1f} us/message, "
              f"{took / len(out.rows) * 1e6:.1f} us/row, {n / took:,.0f} messages/s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)
