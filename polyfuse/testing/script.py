"""Print a graph spec as a runnable Python script that uses only the public te API.

The script builds the graph with ``te.placeholder``/``te.compute``/``te.reduce_axis``, feeds
it the exact input values of the failing run (NaN and infinities included), compiles it,
runs it on the emulator, compares every output against ``polyfuse.reference.evaluate`` with the
fuzzer's comparator, prints what differs, and exits with status 1 when something does (an
exception from the compiler or the emulator propagates: also a non-zero status). A bug report
is this script.
"""

from __future__ import annotations

import numpy as np

from .build import input_values, reduce_layout
from .dtypes import perturbation, precision
from .generate import ONE, GraphSpec, Node, family_kind, te_name

__all__ = ["to_script"]


def _idx(n: int) -> list[str]:
    return [f"i{d}" for d in range(n)]


def _read(name: str, shape: tuple[str, ...], out: tuple[str, ...], idx: list[str]) -> str:
    """Text of reading ``name`` (symbolic ``shape``) at the point ``idx`` of broadcast ``out``."""
    if not shape:
        return f"{name}[()]"
    off = len(out) - len(shape)
    subs = ["0" if s == ONE and out[off + d] != ONE else idx[off + d] for d, s in enumerate(shape)]
    return f"{name}[{', '.join(subs)}]"


def _unary(op: str, v: str) -> str:
    if op == "neg":
        return f"-({v})"
    if op == "square":
        return f"{v} * {v}"
    return f"te.{op}({v})"


def _binary(op: str, a: str, b: str) -> str:
    sym = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
    if op in sym:
        return f"({a} {sym[op]} {b})"
    return f"te.{op}({a}, {b})"


_CMP = {"gt": ">", "lt": "<", "ge": ">=", "le": "<="}


def _node(spec: GraphSpec, n: Node) -> list[str]:
    shape = spec.size(n.shape)
    if n.kind == "input":
        dtype = f"{n.dtype!r}, " if _typed(spec) else ""
        return [f"{n.name} = te.placeholder({shape!r}, {dtype}name={te_name(spec, n)!r})"]
    if (fam := family_kind(n.kind)) is not None:  # a generator family's kind (ops calls)
        return fam.source[n.kind](spec, n)
    shapes = [spec.node(a).shape for a in n.args]
    idx = _idx(len(shape))
    lines: list[str] = []

    def rd(k: int) -> str:
        return _cast(n, k, _read(n.args[k], shapes[k], n.shape, idx))

    if n.kind == "unary":
        body = _unary(n.op, rd(0))
    elif n.kind == "binary":
        body = _binary(n.op, rd(0), repr(n.const) if n.const is not None else rd(1))
    elif n.kind == "where":
        body = f"te.where({rd(0)} {_CMP[n.op]} {n.const!r}, {rd(1)}, {rd(2)})"
    elif n.kind == "transpose":
        body = _cast(n, 0, f"{n.args[0]}[i1, i0]")
    elif n.kind == "matmul":
        k = spec.size(shapes[0])[1]
        lines.append(f'{n.name}_k = te.reduce_axis({k}, name="{n.name}_k")')
        b = f"{n.args[1]}[i1, {n.name}_k]" if n.op == "nt" else f"{n.args[1]}[{n.name}_k, i1]"
        a = _cast(n, 0, f"{n.args[0]}[i0, {n.name}_k]")
        if n.pre:
            a = _unary(n.pre, a)
        body = f"te.sum({a} * {_cast(n, 1, b)}, axis={n.name}_k)"
    elif n.kind == "reduce":
        src = spec.size(shapes[0])
        for d in n.axes:
            lines.append(f'{n.name}_k{d} = te.reduce_axis({src[d]}, name="{n.name}_k{d}")')
        layout = reduce_layout(n, len(src))
        subs = [f"{n.name}_k{d}" if kind == "k" else idx[d] for kind, d in layout]
        v = _cast(n, 0, f"{n.args[0]}[{', '.join(subs)}]" if subs else f"{n.args[0]}[()]")
        if n.pre:
            v = _unary(n.pre, v)
        axis = "[" + ", ".join(f"{n.name}_k{d}" for d in n.axes) + "]"
        if n.op == "mean":
            count = int(np.prod([src[d] for d in n.axes]))
            body = f"te.sum({v}, axis={axis}) / {float(count)!r}"
        else:
            body = f"te.{n.op}({v}, axis={axis})"
    else:
        raise ValueError(f"unknown node kind {n.kind}")
    lam = f"lambda {', '.join(idx)}: {body}" if idx else f"lambda: {body}"
    dtype = f", dtype={n.dtype!r}" if _typed(spec) else ""
    lines.append(f"{n.name} = te.compute({shape!r}, {lam}, name={te_name(spec, n)!r}{dtype})")
    return lines


def _typed(spec: GraphSpec) -> bool:
    """Whether ``spec`` has a dtype other than float32 (its script then spells every one)."""
    return any(n.dtype != "float32" or any(n.casts) for n in spec.nodes)


def _cast(n: Node, k: int, v: str) -> str:
    """Text of read ``v`` of argument ``k`` of ``n``, cast as ``n.casts`` says."""
    return f"te.cast({v}, {n.casts[k]!r})" if k < len(n.casts) and n.casts[k] else v


#: numpy spelling of each dtype's array in a script.
_NUMPY = {
    "float32": "np.float32",
    "float16": "np.float16",
    "bfloat16": "ml_dtypes.bfloat16",
    "float64": "np.float64",
    "int32": "np.int32",
    "int64": "np.int64",
    "bool": "np.bool_",
}


def _array(v: np.ndarray, dtype: str = "float32") -> str:
    """``v`` as numpy source: its exact values (float ones through float, whose repr is exact
    for every 16- and 32-bit float), in its dtype."""
    if v.dtype.kind in "biu":
        flat = ", ".join(repr(x.item()) for x in v.ravel())
    else:
        flat = ", ".join(repr(float(x)) for x in v.ravel())
    return f"np.array([{flat}], dtype={_NUMPY[dtype]}).reshape({v.shape!r})"


def _bf16(spec: GraphSpec) -> bool:
    return any(n.dtype == "bfloat16" and n.kind == "input" for n in spec.nodes)


def to_script(spec: GraphSpec, *, race_check: bool = False, title: str = "") -> str:
    """A runnable script that reproduces ``spec``'s run (see the module docstring)."""
    spec = spec.pruned()
    feeds = input_values(spec)
    moves = perturbation(spec)
    lines = [
        f'"""{title or "A graph found by polyfuse fuzz"} (seed {spec.seed}).',
        "",
        "Run it: exit status 1 and a line per wrong output when the compiled graph disagrees",
        'with polyfuse.reference.evaluate."""',
        "",
        "import sys",
        "",
        "import numpy as np",
        *(["import ml_dtypes", ""] if _bf16(spec) else [""]),
        "import polyfuse",
        "from polyfuse import ops, te",
        "from polyfuse.reference import evaluate",
        "from polyfuse.testing.run import compare, perturbed_references",
        "",
        'nan, inf = float("nan"), float("inf")',
        "",
    ]
    for n in spec.nodes:
        lines += _node(spec, n)
    ins = [n.name for n in spec.inputs]
    lines += [
        "",
        f"inputs = [{', '.join(ins)}]",
        f"outputs = [{', '.join(spec.outputs)}]",
        "feeds = [",
        *(f"    {_array(feeds[i], spec.node(i).dtype)},  # {i}" for i in ins),
        "]",
        "",
        'fn = polyfuse.compile(inputs, outputs, check_cuda=False, name="fuzz")',
        f'got = fn(*feeds, device="emulate", race_check={race_check!r})',
        "got = got if isinstance(got, tuple) else (got,)",
        "by_input = dict(zip(inputs, feeds))",
        "want = evaluate(outputs, by_input)",
        f"moves = {{{', '.join(f'{i}: {moves[i]!r}' for i in ins)}}}",
        f"moved = perturbed_references(outputs, by_input, {spec.seed}, moves)",
        'oracle = evaluate(outputs, by_input, precision="float64")',
        'rounded = evaluate(outputs, by_input, precision="operation")',
        f"precisions = {[precision(spec, o) for o in spec.outputs]!r}  # the tolerances' dtypes",
        "bad = 0",
        "for k, (t, g, w) in enumerate(zip(outputs, got, want)):",
        "    others = [oracle[k], rounded[k]]",
        "    why = compare(t.name, g, w, [m[k] for m in moved], precisions[k], others)",
        "    if why:",
        "        bad += 1",
        "        print(why)",
        '        print("  got: ", np.array2string(g, threshold=20))',
        '        print("  want:", np.array2string(w, threshold=20))',
        'print(f"{bad} of {len(outputs)} outputs differ from the reference")',
        "sys.exit(1 if bad else 0)",
        "",
    ]
    return "\n".join(lines)
