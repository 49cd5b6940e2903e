"""ONNX operator conformance: the onnx package's own test cases run through polyfuse.

Suites: ``node`` (``onnx.backend.test.case.node``: the per-operator cases, generated in memory;
only cases whose node is an operator in :data:`SUPPORTED_OPS`, ``_expanded`` function bodies
excluded), and the model suites shipped as data in the onnx wheel (``pytorch-converted``,
``pytorch-operator``, ``simple``). Each case is imported, compiled and run on the CPU emulator
through :class:`~polyfuse.onnx.backend.PolyfuseBackend` and compared with the expected outputs at
the case's tolerances. Each case has a dtype group (:func:`case_dtypes`) and the table counts it
under one dtype column (:func:`column_of`): float32 (integer and boolean tensors beside it
allowed), int/bool (integer and boolean tensors only), float16, bfloat16, float64, 8/4-bit
floats, other; a compile refused with ``UnsupportedDtypeError`` is counted as such.
``--dtypes float16,bfloat16`` runs the cases of some columns only.

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
    #: the floating dtypes the case reads or writes ("float32" also for none; "float16",
    #: "float16+float32" for a Cast, ...): see :func:`case_dtypes`
    dtypes: str = "float32"
    #: the compile refused a dtype code generation does not store (``UnsupportedDtypeError``)
    refused: bool = False
    #: passed by :func:`closer_than_expected` (a 16-bit output off the expected one by more
    #: than the tolerance, but nowhere farther from the float64 evaluation than it)
    by_float64: bool = False


def _is_float32(arrays: Sequence[np.ndarray]) -> bool:
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind in "fc" and a.dtype != np.float32:
            return False
        if a.dtype.kind in "OUSV" or a.dtype.name in _FLOATS:
            return False
    return True


def case_dtypes(model: object, arrays: Sequence[np.ndarray]) -> str:
    """The dtype group of a case: its floating dtypes other than float32, joined with ``+``
    (float32 joins when present alongside: ``float16+float32`` is a Cast between them), from the
    graph's declared inputs and outputs and the case's data; ``float32`` when there are none
    (float32 tensors, integer and boolean ones beside them); ``int`` when there is no floating
    tensor at all (integers and booleans only); ``other`` for strings and objects."""
    from onnx import helper

    found: set[str] = set()
    graph = getattr(model, "graph", None)
    for vi in [*getattr(graph, "input", ()), *getattr(graph, "output", ())]:
        et = vi.type.tensor_type.elem_type
        if et:
            found.add(np.dtype(helper.tensor_dtype_to_np_dtype(et)).name)
    for a in arrays:
        found.add(np.asarray(a).dtype.name)
    if any(d == "object" or d.startswith(("str", "bytes")) for d in found):
        return "other"
    floats = {d for d in found if "float" in d}
    if not floats and any(d.startswith(("int", "uint", "bool")) for d in found):
        return "int"
    if floats <= {"float32"}:
        return "float32"
    return "+".join(sorted(floats))


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


_HALF_CODES = (10, 16)  # TensorProto FLOAT16, BFLOAT16


def _float64_outputs(model: object, ins: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """The outputs of ``model`` evaluated by onnx's reference with its 16-bit and float32
    inputs, outputs and initializers retyped to float64 (None when it cannot be evaluated)."""
    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    m = onnx.ModelProto()
    m.CopyFrom(model)  # type: ignore[arg-type]
    floats = (1, *_HALF_CODES)
    for vi in [*m.graph.input, *m.graph.output]:
        if vi.type.tensor_type.elem_type in floats:
            vi.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    del m.graph.value_info[:]
    for k, t in enumerate(m.graph.initializer):
        if t.data_type in floats:
            a = numpy_helper.to_array(t).astype(np.float64)
            m.graph.initializer[k].CopyFrom(numpy_helper.from_array(a, t.name))
    feeds = {}
    for vi, a in zip(m.graph.input, ins, strict=False):
        a = np.asarray(a)
        wide = a.dtype.kind == "f" or a.dtype.name in ("bfloat16",)
        feeds[vi.name] = a.astype(np.float64) if wide else a
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [np.asarray(o) for o in ReferenceEvaluator(m).run(None, feeds)]
    except Exception:  # noqa: BLE001  (no float64 form: the case stays failed)
        return None


#: the output dtypes :func:`closer_than_expected` may pass
_NEARER = ("float16", "bfloat16", "float32")


def closer_than_expected(
    got: np.ndarray, expected: np.ndarray, truth: np.ndarray, rtol: float = 0.0, atol: float = 0.0
) -> bool:
    """Is a float32 or 16-bit output ``got``, wherever it is not within ``rtol``/``atol`` of
    the expected output, no farther from the float64 evaluation ``truth`` than the expected
    output is, give or take one unit in the last place of the output dtype?

    The onnx reference computes a float16/bfloat16 case in that dtype step by step (a
    bfloat16 matmul rounds after every addition), so its expected values can sit a unit or
    two off the exact answer; polyfuse rounds once, as torch's kernels do. A float32 value
    that should be 0 carries the reference's rounding noise (an inverse DFT's 1.9e-7), which
    an absolute tolerance of 1e-7 then demands.
    """
    import ml_dtypes

    if expected.shape != got.shape or expected.dtype.name not in _NEARER:
        return False
    eps = float(ml_dtypes.finfo(expected.dtype).eps)  # (numpy's finfo for float32)
    e, g, t = (np.asarray(a, dtype=np.float64) for a in (expected, got, truth))
    ulp = eps * np.exp2(np.floor(np.log2(np.maximum(np.abs(e), 1e-30))))
    with np.errstate(invalid="ignore"):
        ok = (np.abs(g - t) <= np.abs(e - t) + ulp) | (np.abs(g - e) <= atol + rtol * np.abs(e))
    same_nan = np.isnan(g) & np.isnan(e)
    return bool(np.all(ok | same_nan))


def run_case(suite: str, name: str) -> CaseResult:
    """Import, compile and run one case on the emulator; compare with its expected outputs."""
    from polyfuse.onnx.backend import PolyfuseBackend

    t0 = time.perf_counter()
    from polyfuse.errors import UnsupportedDtypeError

    op = suite
    f32 = True
    group = "float32"
    try:
        model, sets, rtol, atol = _load_case(suite, name)
        if suite == "node":
            op = model.graph.node[-1].op_type
        f32 = all(_is_float32(i) and _is_float32(o) for i, o in sets)
        group = case_dtypes(model, [a for i, o in sets for a in (*i, *o)])
        rep = PolyfuseBackend.prepare(model, "CPU")
        by_float64 = False
        for ins, outs in sets:
            got = rep.run(ins)
            if len(got) != len(outs):
                raise AssertionError(f"{len(got)} outputs, expected {len(outs)}")
            truth: list[np.ndarray] | None = None
            for k, (g, e) in enumerate(zip(got, outs, strict=True)):
                g, e = np.asarray(g), np.asarray(e)
                if g.shape != e.shape:
                    raise AssertionError(f"output {k}: shape {g.shape}, expected {e.shape}")
                if e.dtype.name in _NEARER and not np.allclose(
                    g.astype(np.float32), e.astype(np.float32), rtol, atol, equal_nan=True
                ):
                    truth = _float64_outputs(model, ins) if truth is None else truth
                    if truth is not None and closer_than_expected(g, e, truth[k], rtol, atol):
                        by_float64 = True
                        continue
                if e.dtype.kind == "V" and e.dtype.name.startswith(("bfloat", "float")):
                    # ml_dtypes floats (bfloat16, float8, float4; kind "V"): compare as float32,
                    # where NaN equals NaN (assert_array_equal on float8 NaNs failed them)
                    g, e = g.astype(np.float32), e.astype(np.float32)
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
        refused = isinstance(e, UnsupportedDtypeError)
        return CaseResult(
            suite, name, op, f32, False, reason, time.perf_counter() - t0, group, refused
        )
    return CaseResult(
        suite, name, op, f32, True, "", time.perf_counter() - t0, group, by_float64=by_float64
    )


def _dtypes_of(suite: str, name: str) -> str:
    """The dtype group of a case, from its model and data (loads the case; from the model
    alone when its data are not arrays, e.g. sequences)."""
    try:
        model, sets, _, _ = _load_case(suite, name)
    except Exception:  # noqa: BLE001  (run_case reports the failure itself)
        if suite != "node":
            return "other"
        return case_dtypes(_NODE_CACHE[name].model, [])  # type: ignore[attr-defined]
    return case_dtypes(model, [a for i, o in sets for a in (*i, *o)])


def _run(args: tuple[str, str]) -> CaseResult:
    return run_case(*args)


#: the columns of the table: a case's dtype group falls in the first column that matches
COLUMNS = ("float32", "int/bool", "float16", "bfloat16", "float64", "float8/float4", "other")


def column_of(group: str) -> str:
    """The table column of dtype group ``group`` (see :func:`case_dtypes`): strings and 8/4-bit
    floats first, then float64, bfloat16, float16 (a Cast float16→float64 counts as float64:
    that is what decides it), float32 last."""
    parts = group.split("+")
    if group == "other":
        return "other"
    if group == "int":
        return "int/bool"
    if any(p.startswith(("float8", "float4")) for p in parts):
        return "float8/float4"
    for c in ("float64", "bfloat16", "float16"):
        if c in parts:
            return c
    return "float32"


def _cell(rs: list[CaseResult]) -> str:
    if not rs:
        return ""
    refused = sum(r.refused for r in rs)
    wide = sum(r.by_float64 for r in rs)
    cell = f"{sum(r.passed for r in rs)} / {len(rs)}"
    notes = [f"{wide} by float64"] * bool(wide) + [f"{refused} refused"] * bool(refused)
    return cell + (f" ({', '.join(notes)})" if notes else "")


def _reason(r: CaseResult) -> str:
    tag = "" if column_of(r.dtypes) in ("float32", "int/bool") else f" ({r.dtypes})"
    return f"`{r.name}`{tag}: {'refused: ' if r.refused else ''}{r.reason}".replace("|", "\\|")


def _table(results: list[CaseResult]) -> str:
    """The markdown table: per suite and per operator, passed / total per dtype column."""
    cols = [c for c in COLUMNS if any(column_of(r.dtypes) == c for r in results)]
    head = " | ".join(cols)
    lines = [
        "# ONNX conformance",
        "",
        "Generated by `python -m polyfuse.onnx.conformance --suites all --jobs 2 "
        "--write docs/onnx-conformance.md` (CPU emulator). Cells are *passed / total* per "
        "dtype: a case counts under the floating dtype that decides it (float32 also holds "
        "cases with integer or boolean tensors beside float32 ones, int/bool the cases without "
        "a floating tensor; a Cast between float16 and float64 counts as float64). *refused*: "
        "the compile raised `UnsupportedDtypeError` (a dtype code generation does not store). "
        "float64 tensors import and compile as float64 (never downcast). uint8, int8, int16, "
        "int32, int64 and bool tensors run in their own dtype, exactly (uint16 held in int32, "
        "uint32/uint64 in int64; integer Div truncates, Mod follows fmod). *by float64*: a "
        "float32 or 16-bit output off the expected one by more than the case's tolerance that "
        "is nowhere farther (give or take one unit in the last place) from the float64 "
        "evaluation of the same model than the expected output is: the onnx reference rounds "
        "every step in 16 bits (a bfloat16 matmul after every addition), polyfuse once.",
        "",
        f"| suite | {head} | all |",
        "|---" * (len(cols) + 2) + "|",
    ]
    by_suite: dict[str, list[CaseResult]] = defaultdict(list)
    for r in results:
        by_suite[r.suite].append(r)

    def row(label: str, rs: list[CaseResult]) -> str:
        cells = [_cell([r for r in rs if column_of(r.dtypes) == c]) for c in cols]
        return f"| {label} | {' | '.join(cells)} | {_cell(rs)} |"

    for s, rs in by_suite.items():
        lines.append(row(s, rs))
    node = by_suite.get("node", [])
    if node:
        lines += [
            "",
            "## Node cases per operator",
            "",
            f"| operator | {head} | all | failures |",
            "|---" * (len(cols) + 3) + "|",
        ]
        by_op: dict[str, list[CaseResult]] = defaultdict(list)
        for r in node:
            by_op[r.op].append(r)
        for op in sorted(by_op):
            rs = by_op[op]
            fails = "; ".join(_reason(r) for r in rs if not r.passed)
            lines.append(row(op, rs) + f" {fails} |")
    for s, rs in by_suite.items():
        if s == "node":
            continue
        bad = [r for r in rs if not r.passed]
        if bad:
            lines += ["", f"## {s}: failures", ""]
            lines += [f"- {_reason(r)}" for r in bad]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: run the suites, print the summary, optionally write the table."""
    p = argparse.ArgumentParser(prog="python -m polyfuse.onnx.conformance")
    p.add_argument("--suites", default="all", help="comma list of " + ", ".join(SUITES))
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("-k", default="", help="only cases whose name contains this")
    p.add_argument("--write", default="", help="write the markdown table here")
    p.add_argument(
        "--dtypes",
        default="",
        help="only cases of these table columns (comma list of " + ", ".join(COLUMNS) + ")",
    )
    a = p.parse_args(argv)
    suites = SUITES if a.suites == "all" else tuple(a.suites.split(","))
    todo: list[tuple[str, str]] = []
    for s in suites:
        todo += node_cases() if s == "node" else model_cases(s)
    todo = [t for t in todo if a.k in t[1]]
    if a.dtypes:
        want = set(a.dtypes.split(","))
        todo = [t for t in todo if column_of(_dtypes_of(*t)) in want]
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
