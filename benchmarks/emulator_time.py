"""Emulator run time of the tiny zoo models: compile once, run on the CPU emulator, median of 3.

Run: ``python benchmarks/emulator_time.py [--repeats N] [--json PATH]``. Prints a table (ms per
model and the sum) and writes JSON (default ``benchmarks/results/emulator_time.json``). Used to
check that emulator changes (race detector, requested-byte counting) do not slow plain runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import polyfuse
from polyfuse import zoo

MODELS = ("bert_base", "gpt2_small", "resnet50", "mobilenet_v2", "lstm")


def measure(name: str, repeats: int) -> float:
    """Median seconds of one emulator run of the tiny ``name`` (after a warm-up run)."""
    m = zoo.build(name, "tiny")
    fn = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False)
    args = m.sample_inputs(1)
    fn(*args, device="emulate")  # builds the emulator library
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args, device="emulate")
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "emulator_time.json"))
    args = ap.parse_args()
    rows = {name: measure(name, args.repeats) for name in MODELS}
    print(f"{'model':14s} {'ms':>8s}")
    for name, s in rows.items():
        print(f"{name:14s} {s * 1000:8.1f}")
    print(f"{'total':14s} {sum(rows.values()) * 1000:8.1f}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seconds": rows, "total": sum(rows.values())}, indent=2))


if __name__ == "__main__":
    main()
