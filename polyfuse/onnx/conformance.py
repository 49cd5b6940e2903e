"""ONNX operator conformance: the onnx package's own test cases run through polyfuse.

Suites: ``node`` (``onnx.backend.test.case.node``: the per-operator cases, generated in memory;
only cases whose node is an operator in :data:`SUPPORTED_OPS`, ``_expanded`` function bodies
excluded), and the model suites shipped as data in the onnx wheel (``pytorch-converted``,
``pytorch-operator``, ``simple``). Each case is imported, compiled and run on the CPU emulator
through :class:`~polyfuse.onnx.backend.PolyfuseBackend` and compared with the expected outputs at
the case's tolerances. A case is *float32* when every floating tensor it reads or writes is
float32 (integer and boolean tensors allowed): those are the ones polyfuse claims.

    python -m polyfuse.onnx.conformance --suites all --jobs 2 --write docs/onnx-conformance.md

prints per-operator passed/total with the reason of each failure and writes the table.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
import traceback
import warnings
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

__all__ = ["CaseResult", "main", "run_case", "node_cases", "model_cases"]

SUITES = ("node", "pytorch-converted", "pytorch-operator", "simple")
_FLOATS = {"float16", "float64", "bfloat16"}


@dataclass
class CaseResult:
    """One case: suite, name, operator (node suite) or suite name, float32-ness, outcome."""

    suite: str
    name: str
    op: str
    float32: bool
    passed: bool
    reason: str = ""
    seconds: float = 0.0


def _is_float32(arrays: Sequence[np.ndarray]) -> bool:
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind in "fc" and a.dtype != np.float32:
            return False
        if a.dtype.kind in "OUSV" or a.dtype.name in _FLOATS:
            return False
    return True


def node_cases() -> list[tuple[str, str]]:
    """(suite, case name) of every node case whose operator polyfuse claims."""
    from onnx.backend.test.case import node

    from polyfuse.onnx.importer import SUPPORTED_OPS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    out = []
    for c in cases:
        if "_expanded" in c.name:
            continue
        ops_ = {n.op_type for n in c.model.graph.node}
        if c.model.graph.node and c.model.graph.node[-1].op_type in SUPPORTED_OPS and ops_:
            out.append(("node", c.name))
    return out


def _data_root() -> str:
    import onnx.backend.test

    return os.path.join(os.path.dirname(onnx.backend.test.__file__), "data")


def model_cases(suite: str) -> list[tuple[str, str]]:
    """(suite, case name) of a model suite shipped in the onnx wheel."""
    root = os.path.join(_data_root(), suite)
    return [(suite, os.path.basename(d)) for d in sorted(glob.glob(os.path.join(root, "test_*")))]


_NODE_CACHE: dict[str, object] = {}


def _load_case(suite: str, name: str):  # noqa: ANN202
    """(model, [(inputs, outputs)], rtol, atol) of one case."""
    import onnx
    from onnx import numpy_helper

    if suite == "node":
        if not _NODE_CACHE:
            from onnx.backend.test.case import node

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for c in node.collect_testcases(None):
                    _NODE_CACHE[c.name] = c
        c = _NODE_CACHE[name]

        def arr(v: object) -> np.ndarray:
            return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)

        sets = [
            ([arr(v) for v in i], [arr(v) for v in o])
            for i, o in c.data_sets  # type: ignore[attr-defined]
        ]
        return c.model, sets, c.rtol, c.atol  # type: ignore[attr-defined]
    d = os.path.join(_data_root(), suite, name)
    model = onnx.load(os.path.join(d, "model.onnx"))
    sets = []
    for ds in sorted(glob.glob(os.path.join(d, "test_data_set_*"))):
        ins, outs = [], []
        for kind, lst in (("input", ins), ("output", outs)):
            files = sorted(
                glob.glob(os.path.join(ds, f"{kind}_*.pb")),
                key=lambda p: int(p.rsplit("_", 1)[1][:-3]),
            )
            for f in files:
                t = onnx.TensorProto()
                with open(f, "rb") as fh:
                    t.ParseFromString(fh.read())
                lst.append(numpy_helper.to_array(t))
        sets.append((ins, outs))
    return model, sets, 1e-3, 1e-7


def run_case(suite: str, name: str) -> CaseResult:
    """Import, compile and run one case on the emulator; compare with its expected outputs."""
    from polyfuse.onnx.backend import PolyfuseBackend

    t0 = time.perf_counter()
    op = suite
    f32 = True
    try:
        model, sets, rtol, atol = _load_case(suite, name)
        if suite == "node":
            op = model.graph.node[-1].op_type
        f32 = all(_is_float32(i) and _is_float32(o) for i, o in sets)
        rep = PolyfuseBackend.prepare(model, "CPU")
        for ins, outs in sets:
            got = rep.run(ins)
            if len(got) != len(outs):
                raise AssertionError(f"{len(got)} outputs, expected {len(outs)}")
            for k, (g, e) in enumerate(zip(got, outs, strict=True)):
                g, e = np.asarray(g), np.asarray(e)
                if g.shape != e.shape:
                    raise AssertionError(f"output {k}: shape {g.shape}, expected {e.shape}")
                if e.dtype.kind in "fc":
                    np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"output {k}")
                else:
                    np.testing.assert_array_equal(g, e, err_msg=f"output {k}")
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()
        first = next((m for m in msg if m.strip()), "")
        if isinstance(e, AssertionError):
            first = "wrong result: " + " ".join(m.strip() for m in msg[:4])[:160]
        elif not first:
            first = traceback.format_exception_only(type(e), e)[-1].strip()
        reason = f"{type(e).__name__}: {first}"[:200]
        return CaseResult(suite, name, op, f32, False, reason, time.perf_counter() - t0)
    return CaseResult(suite, name, op, f32, True, "", time.perf_counter() - t0)


def _run(args: tuple[str, str]) -> CaseResult:
    return run_case(*args)


def _table(results: list[CaseResult]) -> str:
    lines = [
        "# ONNX conformance",
        "",
        "Generated by `python -m polyfuse.onnx.conformance --suites all --jobs 2 "
        "--write docs/onnx-conformance.md` (CPU emulator). *float32*: cases whose floating "
        "tensors are all float32 (polyfuse computes in float32; other float types are out of "
        "scope until dtypes exist).",
        "",
        "| suite | float32 passed | float32 total | all passed | all total |",
        "|---|---|---|---|---|",
    ]
    by_suite: dict[str, list[CaseResult]] = defaultdict(list)
    for r in results:
        by_suite[r.suite].append(r)
    for s, rs in by_suite.items():
        f = [r for r in rs if r.float32]
        lines.append(
            f"| {s} | {sum(r.passed for r in f)} | {len(f)} | {sum(r.passed for r in rs)} "
            f"| {len(rs)} |"
        )
    node = by_suite.get("node", [])
    if node:
        lines += [
            "",
            "## Node cases per operator",
            "",
            "| operator | float32 passed / total | all passed / total | failures |",
            "|---|---|---|---|",
        ]
        by_op: dict[str, list[CaseResult]] = defaultdict(list)
        for r in node:
            by_op[r.op].append(r)
        for op in sorted(by_op):
            rs = by_op[op]
            f = [r for r in rs if r.float32]
            fails = "; ".join(
                f"`{r.name}`{'' if r.float32 else ' (not float32)'}: {r.reason}"
                for r in rs
                if not r.passed
            ).replace("|", "\\|")
            lines.append(
                f"| {op} | {sum(r.passed for r in f)} / {len(f)} | "
                f"{sum(r.passed for r in rs)} / {len(rs)} | {fails} |"
            )
    for s, rs in by_suite.items():
        if s == "node":
            continue
        bad = [r for r in rs if not r.passed]
        if bad:
            lines += ["", f"## {s}: failures", ""]
            lines += [
                f"- `{r.name}`{'' if r.float32 else ' (not float32)'}: "
                + r.reason.replace("|", "\\|")
                for r in bad
            ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: run the suites, print the summary, optionally write the table."""
    p = argparse.ArgumentParser(prog="python -m polyfuse.onnx.conformance")
    p.add_argument("--suites", default="all", help="comma list of " + ", ".join(SUITES))
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("-k", default="", help="only cases whose name contains this")
    p.add_argument("--write", default="", help="write the markdown table here")
    a = p.parse_args(argv)
    suites = SUITES if a.suites == "all" else tuple(a.suites.split(","))
    todo: list[tuple[str, str]] = []
    for s in suites:
        todo += node_cases() if s == "node" else model_cases(s)
    todo = [t for t in todo if a.k in t[1]]
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as ex:
            results = list(ex.map(_run, todo, chunksize=4))
    else:
        results = [run_case(*t) for t in todo]
    for r in results:
        if not r.passed:
            print(f"FAIL {r.suite}/{r.name}: {r.reason}", file=sys.stderr)
    table = _table(results)
    print(table.split("\n## ")[0])
    if a.write:
        with open(a.write, "w") as fh:
            fh.write(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
