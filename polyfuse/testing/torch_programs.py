"""Random PyTorch programs for the ``torch.compile(backend="polyfuse")`` backend:
``polyfuse fuzz --torch``.

The te fuzzer (:mod:`.run`) checks the compiler under the backend; this one checks the
backend's lowerings (:mod:`polyfuse.torch.lower`, :mod:`polyfuse.torch.typed`): torch's type
promotion, its 16-bit rounding, views and layouts, gathers, what decomposes into what. A
program is Python source — inputs of drawn shapes and dtypes, then a chain of steps drawn from
:data:`STEPS`, each applied to earlier values — so a failure prints as a runnable script.

Steps are drawn against the values' real shapes: the generator runs each candidate step in
eager PyTorch and keeps it only where it runs, its result is finite and moderate, and it stays
within half the tolerance when its computed float operands move by the tolerance (so no
program depends on an overflow or on which side of a rounding boundary a value lands: an
``any`` of a layer norm over one element, exactly 0 in polyfuse and 5e-5 in eager's
float16 kernel, fuzz seed 20466 at ``--max-elements``). The
program returns every value it computed; :func:`check` compiles it, runs it on the emulator
and compares each value with eager's: same dtype and shape, integers and bools exactly,
floats within the tolerance of the coarsest float dtype the program holds
(:func:`polyfuse.graph.dtypes.tolerance`), relative to the value's magnitude.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .programs import SMALL_ELEMENTS, crash_detail, input_shape, pick_operands, run_programs

__all__ = ["STEPS", "Program", "TorchOutcome", "check", "draw", "fuzz_torch"]

#: dtypes a program draws its inputs from (of those named with ``--dtypes``)
INPUT_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "bool")
#: ... and the narrow integers, drawn after them (so a seed drawn before they were added
#: draws the same program), each over its whole range
NARROW_INPUTS = {"uint8": (0, 256), "int8": (-128, 128), "int16": (-300, 300)}
#: Largest magnitude a float value may have (float16 holds 65504; products of two stay finite).
LIMIT = 200.0

#: Step templates: (name, kinds of operands, template). ``{a}``/``{b}`` are operand names,
#: ``{d}``/``{e}`` dims of ``a``, ``{n}`` a size along ``{d}``, ``{k}`` a small positive int.
#: Kinds: "f" float, "i" integer, "b" bool, "x" any.
STEPS: tuple[tuple[str, str, str], ...] = (
    ("tanh", "f", "torch.tanh({a})"),
    ("sigmoid", "f", "torch.sigmoid({a})"),
    ("erf", "f", "torch.erf({a})"),
    ("relu", "x", "torch.relu({a})"),
    ("gelu", "f", "F.gelu({a})"),
    ("gelu_tanh", "f", "F.gelu({a}, approximate='tanh')"),
    ("elu", "f", "F.elu({a}, 0.7)"),
    ("leaky_relu", "f", "F.leaky_relu({a}, 0.2)"),
    ("silu", "f", "F.silu({a})"),
    ("hardswish", "f", "F.hardswish({a})"),
    ("softplus", "f", "F.softplus({a})"),
    ("exp", "f", "torch.exp({a}.clamp(-4, 4))"),
    ("log1p", "f", "torch.log1p({a}.abs())"),
    ("expm1", "f", "torch.expm1({a}.clamp(-3, 3))"),
    ("rsqrt", "f", "torch.rsqrt({a}.abs() + 1)"),
    ("abs", "x", "{a}.abs()"),
    ("neg", "x", "-{a}"),
    ("clamp", "x", "torch.clamp({a}, -3, 5)"),
    ("add", "xx", "{a} + {b}"),
    ("sub", "xx", "{a} - {b}"),
    ("mul", "xx", "{a} * {b}"),
    ("maximum", "xx", "torch.maximum({a}, {b})"),
    ("minimum", "xx", "torch.minimum({a}, {b})"),
    ("div", "xx", "{a} / ({b}.abs() + 1)"),
    ("scale", "x", "{a} * 3 - 2"),
    ("where", "xx", "torch.where({a} > 0, {a}, {b})"),
    ("floordiv", "ii", "torch.div({a}, {b}.abs() + 1, rounding_mode='floor')"),
    ("truncdiv", "ii", "torch.div({a}, -{b}.abs() - 1, rounding_mode='trunc')"),
    ("remainder", "ii", "{a} % ({b}.abs() + 2)"),
    ("fmod", "i", "torch.fmod({a}, 3)"),
    ("gt", "xx", "{a} > {b}"),
    ("and", "bb", "{a} & {b}"),
    ("not", "b", "~{a}"),
    ("bool_where", "b", "torch.where({a}, 1.5, -0.5)"),
    ("to_int", "f", "({a} * 4).to(torch.int32)"),
    ("to_f16", "x", "{a}.to(torch.float16)"),
    ("to_bf16", "x", "{a}.to(torch.bfloat16)"),
    ("to_f32", "x", "{a}.float()"),
    ("to_f64", "x", "{a}.double()"),
    ("sum", "x", "{a}.sum({d})"),
    ("mean", "f", "{a}.mean({d}, keepdim=True)"),
    ("amax", "x", "{a}.amax({d})"),
    ("amin", "x", "{a}.amin({d}, keepdim=True)"),
    ("var", "f", "torch.var({a}, {d})"),
    ("max_dim", "x", "torch.max({a}, {d}).values"),
    ("argmax", "x", "torch.argmax({a}, {d})"),
    ("topk", "x", "torch.topk({a}, min({k}, {a}.shape[{d}]), {d}).values"),
    ("sort", "x", "torch.sort({a}, {d}, descending=True).values"),
    ("argsort", "x", "torch.argsort({a}, dim={d}, stable=True)"),
    ("median", "x", "torch.median({a}, {d}).values + torch.kthvalue({a}, 1, {d}).values"),
    ("scatter_add", "x",
     "torch.zeros_like({a}).scatter_add({d}, ({a}.abs() * 3).long() % {a}.shape[{d}], {a})"),
    ("one_hot", "x", "F.one_hot(({a}.abs() * 3).long() % 5, 5)"),
    ("index_put", "x", "{a}.index_put(((({a}.abs() * 3).long() % {a}.shape[0]).flatten()[:2],), "
     "{a}[:2], accumulate=True)"),
    ("any", "x", "{a}.any({d})"),
    ("softmax", "f", "torch.softmax({a}, {d})"),
    ("log_softmax", "f", "torch.log_softmax({a}, {d})"),
    ("layer_norm", "f", "F.layer_norm({a}, ({last},))"),
    ("transpose", "x", "{a}.transpose({d}, {e})"),
    ("flatten", "x", "{a}.reshape(-1)"),
    ("unsqueeze", "x", "{a}.unsqueeze({d})"),
    ("stride2", "x", "{a}[..., ::2]"),
    ("narrow", "x", "{a}.narrow({d}, 1, {n} - 1)"),
    ("select", "x", "{a}.select({d}, -1)"),
    ("flip", "x", "torch.flip({a}, [{d}])"),
    ("roll", "x", "torch.roll({a}, {k}, {d})"),
    ("repeat", "x", "{a}.repeat({reps})"),
    ("pad", "x", "F.pad({a}, (1, {k}))"),
    ("cat", "x", "torch.cat([{a}, {a} * 2], {d})"),
    ("index_select", "x", "torch.index_select({a}, {d}, torch.tensor([{n} - 1, 0, {n} // 2]))"),
    ("gather_rows", "x", "{a}[torch.tensor([[0, -1], [1, 0]])]"),
    ("matmul", "f", "{a} @ {a}.transpose(-1, -2)"),
    ("bmm", "ff", "torch.matmul({a}, {b}.transpose(-1, -2))"),
    ("eq", "xx", "{a} == {b}"),
    ("masked_fill", "x", "{a}.masked_fill({a} > 1, 0)"),
    ("int_times_float", "i", "{a} * 0.5"),
    ("std", "f", "{a}.std({d}, keepdim=True)"),
    ("expand", "x", "{a}.unsqueeze(0).expand(2, *{a}.shape)"),
    # cummax stays in PyTorch: a graph break mid-program
    ("cumsum", "x", "torch.cumsum({a}, {d}) + torch.cummax({a}, {d}).values"),
    ("conv2d", "f", "F.conv2d({a}.reshape(1, 1, -1, {last}), "
                    "torch.full((2, 1, 2, 2), 0.3, dtype={a}.dtype), padding=1)"),
    ("max_pool", "f", "F.max_pool2d({a}.reshape(1, 1, -1, {last}), 2, 1, 1)"),
    ("avg_pool", "f", "F.avg_pool2d({a}.reshape(1, 1, -1, {last}), 2, 1)"),
    ("interpolate", "f", "F.interpolate({a}.reshape(1, 1, -1, {last}), scale_factor=2)"),
    ("group_norm", "f", "F.group_norm({a}.reshape(1, 2, -1), 2)"),
    ("attention", "f", "F.scaled_dot_product_attention(*[{a}.reshape(1, -1, {last})] * 3)"),
    ("sin", "f", "torch.sin({a})"),
    ("cos", "f", "torch.cos({a})"),
    ("atan", "f", "torch.atan({a})"),
    ("asinh", "f", "torch.asinh({a})"),
    ("log2", "f", "torch.log2({a}.abs() + 1)"),
    ("reciprocal", "f", "torch.reciprocal({a}.abs() + 1)"),
    ("sign", "x", "torch.sign({a})"),
    ("isnan", "f", "torch.isnan({a})"),
    ("round_decimals", "f", "torch.round({a}, decimals=1)"),
    ("vector_norm", "f", "torch.linalg.vector_norm({a}, 2, {d})"),
    ("normalize", "f", "F.normalize({a}, dim={d})"),
    ("clamp_tensor", "ff", "torch.clamp({a}, min={b})"),
    ("max_pool_ceil", "f", "F.max_pool2d({a}.reshape(1, 1, -1, {last}), 3, 2, 1, ceil_mode=True)"),
    ("avg_pool_ceil", "f", "F.avg_pool2d({a}.reshape(1, 1, -1, {last}), 3, 2, 1, ceil_mode=True, "
                           "count_include_pad={k} > 2)"),
    # grids of exact binary fractions (a 16-bit linspace rounds differently in eager's kernel
    # and in its decomposition, and a sample amplifies that); 16-bit data sampled in float32
    # (eager's 16-bit bicubic computes in 16 bits, 0.18 off at bfloat16 where polyfuse is
    # 0.003 off), float64 in float64
    ("grid_sample", "f", "F.grid_sample({a}.to(_wide({a})).reshape(1, 1, -1, {last}), "
                         "(torch.arange(12.0) * 0.25 - 1.3125).to(_wide({a})).reshape(1, 2, 3, 2), "
                         "mode=('bilinear', 'nearest')[{k} - 1], "
                         "padding_mode=('zeros', 'reflection')[{k} - 1], "
                         "align_corners={k} == 2).to({a}.dtype)"),
    ("grid_sample_cubic", "f", "F.grid_sample({a}.to(_wide({a})).reshape(1, 1, -1, {last}), "
                               "(1.3125 - torch.arange(8.0) * 0.3125).to(_wide({a}))"
                               ".reshape(1, 2, 2, 2), mode='bicubic', padding_mode='border', "
                               "align_corners={k} == 1).to({a}.dtype)"),
    ("shifts", "ii", "({a} << ({b} % 5).abs()) + ({a} >> 2)"),
)


@dataclass
class Program:
    """A drawn program: its ``seed``, ``source`` (defines ``make_inputs()`` and ``f``), and
    the dtypes its values hold."""

    seed: int
    source: str
    dtypes: set[str] = field(default_factory=set)

    def script(self) -> str:
        """A runnable script: the program, then the comparison :func:`check` makes."""
        return (
            f"# polyfuse fuzz --torch, seed {self.seed}\n{self.source}\n"
            "with torch.no_grad():\n"
            "    want = f(*make_inputs())\n"
            "    got = torch.compile(f, backend='polyfuse')(*make_inputs())\n"
            "for k, (g, w) in enumerate(zip(got, want)):\n"
            "    print(k, w.dtype, g.dtype, (g.double() - w.double()).abs().max().item())\n"
        )


@dataclass
class TorchOutcome:
    """What happened to one program: "pass", "mismatch" (a value differs from eager's) or
    "crash" (compiling or running it raised)."""

    program: Program
    status: str
    detail: str = ""
    size: int = 0  # operators the backend ran in regions

    @property
    def failed(self) -> bool:
        return self.status != "pass"


#: ``_wide(t)``: the dtype a grid sample of ``t`` computes in (float32 for 16-bit data)
_WIDE = "def _wide(t):\n    return torch.promote_types(t.dtype, torch.float32)\n"
_HEADER = "import torch\nimport torch.nn.functional as F\n\n\n" + _WIDE


def _kind(t: Any) -> str:
    import torch

    if t.dtype == torch.bool:
        return "b"
    return "f" if t.dtype.is_floating_point else "i"


def _fits(kinds: str, t: Any) -> bool:
    k = _kind(t)
    return kinds == "x" or kinds == k


def _ok(v: Any, max_elements: int = SMALL_ELEMENTS) -> bool:
    """A value a program may keep: a tensor of 1 to ``max_elements`` elements, finite and
    moderate."""
    import torch

    if not isinstance(v, torch.Tensor) or not 0 < v.numel() <= max_elements or v.dim() > 4:
        return False
    if v.dtype.is_floating_point:
        d = v.double()
        return bool(torch.isfinite(d).all()) and float(d.abs().max()) <= LIMIT
    return v.dtype == torch.bool or int(v.abs().max()) <= 100_000


def _input(rng: random.Random, name: str, dtype: str, max_elements: int = SMALL_ELEMENTS) -> str:
    shape = input_shape(rng, 3, max_elements)
    g = f"torch.Generator().manual_seed({rng.randrange(1 << 30)})"
    if dtype == "bool":
        return f"    {name} = torch.rand({shape}, generator={g}) > 0.5"
    if dtype in ("int32", "int64"):
        return f"    {name} = torch.randint(-20, 20, {shape}, generator={g}, dtype=torch.{dtype})"
    if dtype in NARROW_INPUTS:
        lo, hi = NARROW_INPUTS[dtype]
        drawn = f"torch.randint({lo}, {hi}, {shape}, generator={g}, dtype=torch.{dtype})"
        return f"    {name} = {drawn}"
    return f"    {name} = (torch.randn({shape}, generator={g}) * 2).to(torch.{dtype})"


def draw(
    seed: int,
    dtypes: Sequence[str] | None = None,
    steps: int = 6,
    max_elements: int = SMALL_ELEMENTS,
) -> Program:
    """A program of about ``steps`` steps over inputs of ``dtypes`` (float32 alone by
    default; see the module docstring), no tensor beyond ``max_elements``."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    rng = random.Random(f"torch program {seed}")
    pool = [d for d in INPUT_DTYPES if d in (dtypes or ("float32",))] or ["float32"]
    narrow = [d for d in NARROW_INPUTS if d in (dtypes or ())]
    n_in = rng.randint(1, 3)
    lines = [_input(rng, f"x{k}", rng.choice(pool), max_elements) for k in range(n_in)]
    side = random.Random(f"narrow input {seed}")  # its own stream: the rest draws as before
    if narrow and side.random() < 0.3:  # one input narrow instead
        k = side.randrange(n_in)
        lines[k] = _input(side, f"x{k}", side.choice(narrow), max_elements)
    args = ", ".join(f"x{k}" for k in range(n_in))
    head = "def make_inputs():\n" + "\n".join(lines) + f"\n    return ({args},)\n"
    env: dict[str, Any] = {"torch": torch, "F": F}
    exec(_WIDE + head, env)  # noqa: S102 - our own generated source
    inputs = env["make_inputs"]()
    values: dict[str, Any] = {f"x{k}": t for k, t in enumerate(inputs)}
    body: list[str] = []
    tries = 0
    while len(body) < steps and tries < steps * 20:
        tries += 1
        name, kinds, template = rng.choice(STEPS)
        picked = pick_operands(rng, kinds, values, _fits)
        if picked is None:
            continue
        a, b = picked
        t = values[a]
        shape = tuple(t.shape) or (1,)  # a 0-d value: steps naming a dim fail, are skipped
        d, e = rng.randrange(len(shape)), rng.randrange(len(shape))
        reps = ", ".join(str(rng.choice((1, 2))) for _ in shape)
        expr = template.format(a=a, b=b, d=d, e=e, n=shape[d], k=rng.randint(1, 2),
                               last=shape[-1], reps=reps)  # fmt: skip
        if max_elements > SMALL_ELEMENTS and _quadratic(name, shape) > 16 * max_elements:
            continue  # eager would build it first (8.9 GB, seed 20817) and _ok refuse it after
        try:
            with torch.no_grad():
                v = eval(expr, env, dict(values))  # noqa: S307 - our own generated source
        except Exception:
            continue
        if not _ok(v, max_elements):
            continue
        moved = [n for n in dict.fromkeys((a, b))
                 if n.startswith("v") and values[n].dtype.is_floating_point]  # fmt: skip
        held = {str(t.dtype).removeprefix("torch.") for t in [*values.values(), v]}
        if moved and not _stable(expr, env, values, v, moved, _tolerance(held), seed + tries):
            continue
        out = f"v{len(body)}"
        values[out] = v
        body.append(f"    {out} = {expr}  # {name}")
    outs = [n for n in values if n.startswith("v")] or [next(iter(values))]
    src = (
        _HEADER
        + "\n\n"
        + head
        + "\n\n"
        + f"def f({args}):\n"
        + "\n".join(body)
        + ("\n" if body else "")
        + f"    return ({', '.join(outs)},)\n"
    )
    held = {str(v.dtype).removeprefix("torch.") for v in values.values()}
    return Program(seed, src, held)


def _quadratic(name: str, shape: tuple[int, ...]) -> int:
    """About the elements of the square a step builds from its operand of ``shape``: a
    matmul's result (rows x rows per batch) or attention's weights (positions x positions);
    0 for other steps."""
    import math

    rows = math.prod(shape) // shape[-1]
    if name == "attention":
        return rows * rows
    if name in ("matmul", "bmm") and len(shape) >= 2:
        return rows * shape[-2]
    return 0


def _tolerance(dtypes: set[str]) -> Any:
    """The tolerance of the coarsest float dtype of ``dtypes`` (float32's without one)."""
    from polyfuse.graph.dtypes import tolerance

    floats = [d for d in ("bfloat16", "float16", "float32", "float64") if d in dtypes]
    return tolerance(floats[0] if floats else "float32")


def _stable(expr: str, env: dict[str, Any], values: dict[str, Any], base: Any,
            moved: list[str], tol: Any, seed: int) -> bool:  # fmt: skip
    """Whether the step ``expr`` stays within half the tolerance ``tol`` (integers and bools:
    equal) when each computed float operand in ``moved`` moves by up to the tolerance (three
    random moves, and one that makes every value within the tolerance of 0 exactly 0: an
    ``any`` of rounding noise around 0); where not, comparing it would hang on rounding
    noise."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    for trial in range(4):
        moved_values = dict(values)
        for n in moved:
            x = values[n].double()
            room = tol.atol * max(1.0, float(x.abs().max())) + tol.rtol * x.abs()
            if trial == 3:
                moved_values[n] = torch.where(x.abs() <= room, 0.0, x).to(values[n].dtype)
                continue
            shift = torch.rand(x.shape, generator=gen, dtype=torch.float64) * 2 - 1
            moved_values[n] = (x + room * shift).to(values[n].dtype)
        try:
            with torch.no_grad():
                got = eval(expr, env, moved_values)  # noqa: S307 - our own generated source
        except Exception:  # noqa: BLE001 - e.g. a moved value outside an op's domain
            return False
        if not isinstance(got, torch.Tensor) or got.shape != base.shape or got.dtype != base.dtype:
            return False
        if not base.dtype.is_floating_point:
            if not torch.equal(got, base):
                return False
            continue
        g, w = got.double(), base.double()
        room = tol.atol * max(1.0, float(w.abs().max())) + tol.rtol * w.abs()
        if not bool(((g - w).abs() <= 0.5 * room).all()):
            return False
    return True


def _close(got: Any, want: Any, rtol: float, atol: float) -> str:
    """"" when ``got`` matches eager's ``want``, else why not."""
    import torch

    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype}{tuple(got.shape)} where eager gives {want.dtype}{tuple(want.shape)}"
    if not want.dtype.is_floating_point:
        return "" if torch.equal(got, want) else "differs"
    g, w = got.double(), want.double()
    scale = max(1.0, float(w.abs().max()))
    bad = (g - w).abs() > atol * scale + rtol * w.abs()
    if bad.any():
        k = int(bad.flatten().nonzero()[0])
        return f"{g.flatten()[k].item():.6g} where eager gives {w.flatten()[k].item():.6g}"
    return ""


def check(program: Program) -> TorchOutcome:
    """Compile ``program`` with the polyfuse backend, run it on the emulator and compare
    every value with eager's (see the module docstring)."""
    import torch

    import polyfuse.torch as pt

    env: dict[str, Any] = {}
    exec(program.source, env)  # noqa: S102 - our own generated source
    tol = _tolerance(program.dtypes)
    torch._dynamo.reset()
    pt.reset()
    try:
        with torch.no_grad():
            want = env["f"](*env["make_inputs"]())
            got = torch.compile(env["f"], backend="polyfuse")(*env["make_inputs"]())
    except Exception as e:  # a crash is a finding: report it, go on
        return TorchOutcome(program, "crash", crash_detail(e))
    ran = sum(sum(g.polyfuse_report["polyfuse"].values()) for g in pt.compiled_graphs())
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        why = _close(g, w, tol.rtol, tol.atol)
        if why:
            line = program.source.split(f"    v{k} = ")[-1].splitlines()[0] if k else ""
            return TorchOutcome(program, "mismatch", f"value {k} ({line}): {why}", ran)
    return TorchOutcome(program, "pass", "", ran)


def fuzz_torch(
    n: int,
    seed: int = 0,
    dtypes: Sequence[str] | None = None,
    progress: Callable[[int, TorchOutcome], None] | None = None,
    steps: int = 6,
    max_elements: int = SMALL_ELEMENTS,
) -> list[TorchOutcome]:
    """Draw and check ``n`` programs of about ``steps`` steps from ``seed`` on."""
    return run_programs(n, seed, lambda s: draw(s, dtypes, steps, max_elements), check, progress)
