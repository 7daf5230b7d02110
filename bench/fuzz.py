"""Long fuzz runs of the codec and the sans-I/O connection (hostile clients).

The same corpus, mutators and invariants as tests/unit/test_fuzz.py (tests/fuzzing.py), in a
plain deterministic loop: input i of target t uses random.Random(seed, t, i), so any input can
be replayed alone. Prints inputs/s (wall and CPU) per target and saves each distinct crash
(exception + where it was raised) with a reproducer hex dump under --out.

    .venv/bin/python bench/fuzz.py --inputs 1000000              # per target
    nice -n 10 .venv/bin/python bench/fuzz.py --seconds 600 --targets core
    .venv/bin/python bench/fuzz.py --replay bench/results/fuzz/core-1.txt
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests import fuzzing as F  # noqa: E402

TARGETS = ("decoder", "core")


def _seed(seed: int, target: str, i: int) -> int:
    return (seed << 40) | (TARGETS.index(target) << 36) | i


def one(target: str, rng, core: F.CoreTarget | None) -> None:
    """Generate and run one input; on failure the input is attached to the exception as
    `fuzz_input` (level, [bytes of each connection], broker config variant)."""
    if target == "decoder":
        level, data = F.decoder_case(rng)
        streams = [data]
        run = lambda: F.fuzz_decoder(rng, data, level)  # noqa: E731
    else:
        level, streams = F.core_case(rng)
        run = lambda: core.run(rng, *streams)  # noqa: E731
    try:
        run()
    except Exception as exc:
        exc.fuzz_input = (level, streams, core.variant if core else 0)
        raise


def _where(exc: BaseException) -> str:
    """file:line of the innermost frame outside the harness (the broker code that raised)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for f in reversed(frames):
        if "/broker/" in f.filename:
            return f"{os.path.relpath(f.filename)}:{f.lineno}"
    f = frames[-1]
    return f"{os.path.relpath(f.filename)}:{f.lineno}"


def _save(out: str, target: str, n: int, seed: int, i: int, exc: BaseException) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{target}-{n}.txt")
    level, streams, variant = exc.fuzz_input
    with open(path, "w") as f:
        f.write(f"target {target}\nseed {seed}\nindex {i}\nlevel {level}\nvariant {variant}\n")
        f.write(f"where {_where(exc)}\nerror {type(exc).__name__}: {exc}\n")
        f.write(f"hex {','.join(d.hex() for d in streams)}\n")  # one per connection
        for n, data in enumerate(streams):  # the dump, for reading
            f.write(f"\nconnection {n + 1}:\n")
            for k in range(0, len(data), 16):
                f.write(f"{k:06x}  {data[k:k + 16].hex(' ')}\n")
        f.write("\n" + "".join(traceback.format_exception(exc)))
    return path


def fuzz(target: str, inputs: int, seconds: float, seed: int, out: str) -> dict:
    rng = F.new_rng(0)
    core = F.CoreTarget() if target == "core" else None
    seen: dict = {}
    crashes = 0
    cpu0, t0 = time.process_time(), time.monotonic()
    last = t0
    i = 0
    while i < inputs:
        rng.seed(_seed(seed, target, i))
        try:
            one(target, rng, core)
        except Exception as exc:
            crashes += 1
            # one file per kind: same exception, same place, same message up to numbers
            key = (type(exc).__name__, _where(exc),
                   re.sub(r"\d+", "N", str(exc).split("\n")[0][:120]))
            if key not in seen:
                seen[key] = _save(out, target, len(seen) + 1, seed, i, exc)
                print(f"  crash {len(seen)}: {key[0]} at {key[1]}: {key[2]} -> {seen[key]}",
                      flush=True)
        i += 1
        if not i & 1023:
            now = time.monotonic()
            if now - t0 >= seconds:
                break
            if now - last >= 30:
                last = now
                print(f"  {target}: {i} inputs, {i / (now - t0):.0f}/s, {crashes} crashes",
                      flush=True)
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    return {"target": target, "inputs": i, "wall_s": wall, "cpu_s": cpu, "per_s": i / wall,
            "per_cpu_s": i / cpu if cpu else 0.0, "crashes": crashes, "distinct": seen}


def replay(path: str) -> int:
    """Run a saved input again: by its seed on a fresh target, then its bytes fed whole."""
    info = dict(line.split(" ", 1) for line in open(path).read().split("\n\n")[0].splitlines())
    target, seed, i = info["target"], int(info["seed"]), int(info["index"])
    level, streams = int(info["level"]), [bytes.fromhex(h) for h in info["hex"].split(",")]
    variant = int(info["variant"])  # the broker configuration (tests/fuzzing.py CONFIGS)
    rng = F.new_rng(_seed(seed, target, i))
    failed = 0
    for how, run in (("by seed", lambda: one(target, rng, F.CoreTarget(variant=variant))),
                     ("bytes whole", lambda: F.fuzz_decoder(F.new_rng(0), streams[0], level)
                      if target == "decoder" else
                      F.CoreTarget(variant=variant).run(F.new_rng(0), *streams))):
        try:
            run()
            print(f"{how}: passes")
        except Exception:
            failed += 1
            print(f"{how}: fails\n{traceback.format_exc()}")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=10 ** 12, help="inputs per target")
    ap.add_argument("--seconds", type=float, default=float("inf"), help="wall seconds per target")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--out", default="bench/results/fuzz", help="where crash reproducers go")
    ap.add_argument("--replay", metavar="FILE", help="run one saved crash again")
    a = ap.parse_args(argv)
    if a.replay:
        return replay(a.replay)
    if a.inputs == 10 ** 12 and a.seconds == float("inf"):
        a.seconds = 10.0
    import logging
    logging.disable(logging.CRITICAL)  # every rejected input logs a line otherwise
    total = found = 0
    for target in a.targets.split(","):
        r = fuzz(target, a.inputs, a.seconds, a.seed, a.out)
        total += r["inputs"]
        found += len(r["distinct"])
        print(f"{target}: {r['inputs']} inputs in {r['wall_s']:.1f} s wall / {r['cpu_s']:.1f} s CPU"
              f" = {r['per_s']:.0f} inputs/s ({r['per_cpu_s']:.0f} per CPU second), "
              f"{r['crashes']} crashing inputs, {len(r['distinct'])} distinct", flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"total: {total} inputs, {found} distinct crashes, max RSS {rss // 1024} MiB")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
