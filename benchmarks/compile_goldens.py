"""Benchmark compile time of the golden graphs (the memory-bound suite, the test cases and the
tiny zoo: ``tests/golden/generate.py``), every one compiled with no cache.

Issue 21 asks that a redesign keep the compile time of the suite and the tiny zoo within
+10 %: run this in the old and the new checkout alternately (interleaved, so both see the same
machine load) and compare the CPU seconds.

    python benchmarks/compile_goldens.py [--repeat 3]

Prints CPU and wall seconds per run and writes ``benchmarks/results/compile_goldens.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "compile_goldens.json"
sys.path.insert(0, str(ROOT / "tests" / "golden"))

import generate  # noqa: E402


def one_run() -> dict[str, float]:
    """CPU and wall seconds of compiling every golden graph once (names reset per graph)."""
    graphs = list(generate.graphs())
    cpu, wall = time.process_time(), time.perf_counter()
    for name, graph in graphs:
        generate.cuda_of(name, graph)
    return {
        "graphs": len(graphs),
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs in this process")
    args = ap.parse_args()
    import polyfuse  # noqa: F401  (imported before the clock starts)

    runs = [one_run() for _ in range(args.repeat)]
    print(f"{'run':>3}  {'graphs':>6}  {'CPU s':>8}  {'wall s':>8}")
    for i, r in enumerate(runs):
        print(f"{i:>3}  {r['graphs']:>6}  {r['cpu_s']:>8.2f}  {r['wall_s']:>8.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": runs}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
