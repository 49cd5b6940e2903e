"""Cost of the emulator's shadow-memory race detector (``race_check="shadow"``).

For each example of ``polyfuse.examples`` and two larger graphs, times the emulator in plain
mode and under the race detector: the first call (library build, or a cache hit, plus the run)
and the best of ``--repeat`` warm runs. Prints a table and writes JSON
(``benchmarks/results/race_check.json``; ``--json`` to change). Times are CPU-emulator times on
this machine, not GPU times.

    python benchmarks/race_check.py [--repeat 3] [--json out.json]
    POLYFUSE_CACHE=off python benchmarks/race_check.py   # cold library builds
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import polyfuse
from polyfuse import examples, ops, te


def graphs() -> list[tuple[str, list, list]]:
    out = []
    for name, ex in examples.EXAMPLES.items():
        inputs, outputs, _ = ex.build()
        out.append((name, inputs, outputs))
    a, b = te.placeholder((256, 384), name="a"), te.placeholder((384, 320), name="b")
    out.append(("matmul_256x384x320", [a, b], [ops.matmul(a, b)]))
    x = te.placeholder((512, 1000), name="x")
    out.append(("softmax_512x1000", [x], [ops.softmax(x)]))
    return out


def measure(name: str, inputs: list, outputs: list, repeat: int) -> dict:
    fn = polyfuse.compile(inputs=inputs, outputs=outputs, check_cuda=False, name=name)
    arrays = examples.random_inputs(inputs)
    row: dict = {"graph": name, "kernels": len(fn.kernels)}
    for mode, key in ((False, "plain"), ("shadow", "shadow")):
        t0 = time.perf_counter()
        fn(*arrays, race_check=mode)
        row[f"{key}_first_s"] = time.perf_counter() - t0
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(*arrays, race_check=mode)
            best = min(best, time.perf_counter() - t0)
        row[f"{key}_run_s"] = best
    row["ratio"] = row["shadow_run_s"] / row["plain_run_s"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="warm runs per mode (best is kept)")
    ap.add_argument(
        "--json",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "race_check.json",
        help="where to write the results",
    )
    args = ap.parse_args()
    rows = [measure(n, i, o, args.repeat) for n, i, o in graphs()]
    head = f"{'graph':22s} {'kernels':>7s} {'plain 1st':>10s} {'plain run':>10s} "
    head += f"{'shadow 1st':>11s} {'shadow run':>11s} {'ratio':>6s}"
    print(head)
    for r in rows:
        print(
            f"{r['graph']:22s} {r['kernels']:7d} {r['plain_first_s']:9.2f}s "
            f"{r['plain_run_s'] * 1e3:8.1f}ms {r['shadow_first_s']:10.2f}s "
            f"{r['shadow_run_s'] * 1e3:9.1f}ms {r['ratio']:5.1f}x"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
