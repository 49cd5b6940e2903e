"""torch.compile(backend="polyfuse") regions in float64, int32, int64 and bool (issue 22 item
4): each lowered ATen operator gives torch's result dtype (type promotion, true and floor/trunc
division, comparisons, ``where``, casts, integer sums), the region runs in polyfuse (no
operator left in PyTorch for its dtype) and matches eager exactly for integers and bools,
within float64's tolerance for float64. What polyfuse cannot compute exactly in a dtype stays
in PyTorch with a WARNING naming the operator and the reason."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.extra  # needs PyTorch (CI's extras step)
torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import polyfuse.torch as pt  # noqa: E402
from polyfuse.graph.dtypes import tolerance  # noqa: E402
from polyfuse.torch import last_compiled  # noqa: E402

EXACT = (torch.int32, torch.int64, torch.bool)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    pt.reset()
    yield
    torch._dynamo.reset()


def _flat(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _same(got, want, exact: bool = False) -> None:
    """Equal dtypes and shapes; integers and bools (and, with ``exact``, everything) exactly
    equal, floats within their dtype's tolerance."""
    for g, w in zip(_flat(got), _flat(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype)
        if exact or w.dtype in EXACT:
            assert torch.equal(g, w), (g, w)
        else:
            tol = tolerance(str(w.dtype).removeprefix("torch."))
            assert tol.allclose(g.double().numpy(), w.double().numpy()), (g, w)


def _compile_all(fn, *args, dtypes=(), exact: bool = False):
    """Compile ``fn``, compare with eager (:func:`_same`) and assert that every operator ran
    in polyfuse regions (none left in PyTorch, none for its dtype); the regions read
    ``dtypes``."""
    with torch.no_grad():
        got = torch.compile(fn, backend="polyfuse")(*args)
        want = fn(*args)
    _same(got, want, exact)
    g = last_compiled()
    report = g.polyfuse_report
    assert g.polyfuse_regions, "no polyfuse region"
    assert report["eager"] == {}, report["reasons"]
    assert report["eager_for_dtype"] == {}
    seen = {t.dtype for r in g.polyfuse_regions for t in r.lowered.inputs}
    assert set(dtypes) <= seen, seen
    return report


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "polyfuse.torch" and r.levelno == logging.WARNING
    ]


# ----------------------------------------------------------------------------- per dtype


def test_float64_mlp_softmax_layer_norm():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4), nn.Softmax(-1)
    )
    model = model.double().eval()
    x = torch.randn(5, 8, dtype=torch.float64)
    report = _compile_all(model, x, dtypes={"float64"})
    assert report["polyfuse"]["aten.addmm.default"] == 2


def _int_chain(x, y):
    """Arithmetic, floor/trunc division and remainder by constants (negative operands),
    clamp/relu/max, integer sums (int64 in torch) and maxima."""
    a = x * 7 - y + 3
    q = torch.div(a, 4, rounding_mode="floor")
    t = torch.div(a, -3, rounding_mode="trunc")
    r = a % 5
    c = torch.clamp(a, -20, 20) + torch.relu(y) + torch.maximum(x, y)
    return q, t, r, c, a.sum(dim=1), a.amax(dim=0), a.amin(dim=1, keepdim=True), x.abs() - y


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_arithmetic_division_and_reductions(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-1000, 1000, (6, 40), generator=g, dtype=dtype)
    y = torch.randint(-1000, 1000, (6, 40), generator=g, dtype=dtype)
    _compile_all(_int_chain, x, y, dtypes={str(dtype).removeprefix("torch.")})


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_division_and_remainder_by_a_tensor(dtype):
    """Floor, trunc and remainder of integers by a tensor divisor, every sign pair and exact
    multiples; a zero divisor gives 0 (eager torch raises, so eager is given 1 there)."""
    g = torch.Generator().manual_seed(7)
    a = torch.randint(-1000, 1000, (5, 64), generator=g, dtype=dtype)
    b = torch.randint(-9, 10, (5, 64), generator=g, dtype=dtype)
    a[0, :8] = b[0, :8] * 3  # exact multiples: no rounding either way

    def f(a, b):
        return (
            torch.div(a, b, rounding_mode="floor"),
            torch.div(a, b, rounding_mode="trunc"),
            a // b,
            a % b,
            torch.remainder(a + 1, b) * 2,
            7 // b,
        )

    with torch.no_grad():
        got = torch.compile(f, backend="polyfuse")(a, b)
        want = f(a, torch.where(b == 0, 1, b))
    report = last_compiled().polyfuse_report
    assert report["eager"] == {} and report["eager_for_dtype"] == {}, report["reasons"]
    zero = b == 0
    assert zero.any()
    for got_t, want_t in zip(got, want, strict=True):
        assert got_t.dtype == want_t.dtype == dtype
        assert torch.equal(got_t[~zero], want_t[~zero])
    for got_t in got[:4]:
        assert torch.equal(got_t[zero], torch.zeros_like(got_t[zero]))


def test_int32_wraps_in_twos_complement_like_torch():
    x = torch.tensor([2**31 - 1, -(2**31), 123456789, -987654321], dtype=torch.int32)
    _compile_all(lambda v: (v * 1000003 + 1, (v + 1) * -1), x, dtypes={"int32"})


def test_bool_masks():
    g = torch.Generator().manual_seed(2)
    m = torch.rand(6, 33, generator=g) > 0.4
    k = torch.rand(6, 33, generator=g) > 0.7

    def masks(m, k):
        both = m & ~k
        either = m | k
        diff = m ^ k
        return both, either, diff, both.any(dim=1), either.all(dim=0), m.sum(dim=1), m == k

    _compile_all(masks, m, k, dtypes={"bool"})



def test_bool_products_and_sums_are_logical_and_and_or():
    """torch fuzz (default size, from seed 8800): ``mask * mask`` and ``mask + mask`` stayed in
    PyTorch ("arithmetic on bool tensors"), splitting the region. Of two bools torch's
    product is their and, their sum their or (a False ``alpha`` drops the second)."""
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randn(5, 7, generator=g) for _ in range(3))

    def f(a, b, c):
        m, n = a > 0, b > 0
        added = torch.add(m, n, alpha=False), torch.add(m, n, alpha=True)
        return (m * n, m + n, m * True, m + False, m * False, m + True, *added, (m * n + m) * c)

    _compile_all(f, a, b, c, dtypes={"float32"})


def test_cumsum_of_every_dtype_runs_in_polyfuse():
    """``torch.cumsum`` stayed in PyTorch (a graph break; HF models number positions with
    ``mask.cumsum(-1)``). It is one reduction per row under ``k <= j``: floats keep their
    dtype (16-bit accumulate in float32), integers and bools count in int64 unless
    ``dtype=`` says, a 0-d tensor is its own prefix."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn(5, 300, generator=g)
    h = torch.randn(7, 3, generator=g).half()
    i = torch.randint(-9, 9, (5, 300), dtype=torch.int32, generator=g)

    def f(a, h, i):
        m = a > 0
        return (torch.cumsum(a, 1), torch.cumsum(h, 0), torch.cumsum(i, -1), m.cumsum(1),
                a.cumsum(1, dtype=torch.float64), torch.cumsum(i, 0, dtype=torch.int32),
                torch.cumsum(a[0, 0], 0), i.cumsum(1).to(torch.float32) * a)  # fmt: skip

    _compile_all(f, a, h, i, dtypes={"float32", "float16", "int32"})


def test_tensors_made_in_the_traced_code_run_in_polyfuse():
    """``torch.tensor([...])`` inside a compiled function traces to ``aten.lift_fresh_copy``
    of a constant, which stayed in PyTorch (torch fuzz: index tensors of an index_select after
    a graph break). It is a copy: the region reads the constant itself."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 3, generator=g)

    def f(x):
        picked = x[torch.tensor([0, -1]), torch.tensor([2, 1])]
        scaled = x.half() * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)
        return x + torch.tensor([1.0, 2.0, 3.0]) * 2, picked, scaled

    _compile_all(f, x, dtypes={"float32", "int64", "float16"})


def test_math_norms_diagonals_and_rounding_run_in_polyfuse():
    """Operators that stayed in PyTorch though te computes them: ``sin`` ... ``atanh``,
    ``atan2``,
    ``exp2``/``log2``/``log10`` (RoPE's angles), ``reciprocal``, ``isnan`` (``nan_to_num``),
    ``sign`` (0 for NaN, as torch), ``linalg_vector_norm`` (``F.normalize``,
    ``cosine_similarity``; a float16 sum of squares in float32), ``clamp`` by tensors,
    ``round(decimals=)`` and ``diagonal``. Each runs in polyfuse and matches eager."""
    g = torch.Generator().manual_seed(8)
    v = torch.randn(4, 10, generator=g)
    v[0, :4] = torch.tensor([0.0, -0.0, float("nan"), float("inf")])
    h = (torch.randn(3, 300, generator=g) * 100).half()
    x = torch.randn(2, 5, 6, 7, generator=g)
    i = torch.arange(-3, 9).reshape(3, 4)

    def f(v, h, x, i):
        pos = i.float()[:, :, None] * torch.exp2(-torch.arange(4.0))
        math_ = (v.sin(), v.cos(), torch.tan(v), torch.asin(v / 4), torch.acos(v / 4),
                 v.atan(), v.sinh(), v.cosh(), v.asinh(), (v.abs() + 1).acosh(),
                 torch.atanh(v / 3), torch.log2(v), torch.log10(v), h.sin(), i.cos(),
                 torch.cat([pos, pos], -1).cos(), torch.reciprocal(i), torch.reciprocal(v),
                 torch.atan2(v, v.flip(0)), torch.atan2(h, h.flip(1)), torch.atan2(i, i.flip(1)))
        nans = (torch.isnan(v.log()), torch.nan_to_num(v.log(), 0.5, 1e3, -1e3), v.sign(),
                i.sign(), (i > 0).sign())
        norms = (torch.linalg.vector_norm(v, dim=1), v.norm(dim=0), h.norm(dim=1),
                 torch.linalg.vector_norm(v, 1, dim=(0, 1), keepdim=True),
                 torch.linalg.vector_norm(v.nan_to_num(), float("inf"), dim=0),
                 torch.linalg.vector_norm(v, float("-inf")), torch.linalg.vector_norm(v, 0, 1),
                 torch.linalg.vector_norm(v, 3, dim=1),
                 torch.linalg.vector_norm(h, dtype=torch.float32),
                 F.normalize(x, dim=1), F.cosine_similarity(x, x.flip(0)))
        rest = (torch.clamp(x, x.flip(0), x.flip(1) + 1), torch.round(v * 10, decimals=1),
                torch.round(h, decimals=-2), torch.diagonal(x, 2, 1, 3) + 1,
                torch.diagonal(x, -1, -1, 2) * 2, torch.diag(v[:, :4]) + 1)
        return (*math_, *nans, *norms, *rest)

    _compile_all(f, v, h, x, i, dtypes={"float32", "float16", "int64"})


def test_bitwise_operators_on_integers_run_in_polyfuse():
    """``&``, ``|``, ``^`` and ``~`` of integers stayed in PyTorch (te's ``&`` and ``|`` are
    logical); they are bitwise now, two's complement as torch, by a tensor or a number."""
    g = torch.Generator().manual_seed(9)
    a = torch.randint(-2**31, 2**31 - 1, (4, 8), generator=g, dtype=torch.int32)
    b = torch.randint(-2**62, 2**62, (8,), generator=g)

    def f(a, b):
        return a & b, a | 0x0F0F, a ^ b, ~a, ~b, (a + 2) & 6, (a > 0) & (b < 0), ~(a > 0)

    _compile_all(f, a, b, dtypes={"int32", "int64"})


def test_shifts_of_integers_run_in_polyfuse():
    """``<<`` and ``>>`` of int32 and int64 stayed in PyTorch; they are te shifts now: a left
    shift wraps, a right shift is arithmetic, a count outside [0, width) gives 0 (right: the
    sign), as torch."""
    g = torch.Generator().manual_seed(11)
    a = torch.randint(-2**31, 2**31 - 1, (4, 16), generator=g, dtype=torch.int32)
    n = torch.randint(-3, 40, (16,), generator=g, dtype=torch.int32)
    b = torch.randint(-2**62, 2**62, (16,), generator=g)
    m = torch.randint(-3, 70, (16,), generator=g)

    def f(a, n, b, m):
        return a << n, a >> n, b << m, b >> m, a >> 3, torch.bitwise_left_shift(b, 5)

    _compile_all(f, a, n, b, m, dtypes={"int32", "int64"}, exact=True)


def test_products_and_running_products_run_in_polyfuse():
    """``prod`` and ``cumprod`` stayed in PyTorch (te had no product reduction): floats keep
    their dtype (16-bit accumulate in float32), integers and bools multiply in int64 unless
    ``dtype=`` says, over a dim or everything."""
    g = torch.Generator().manual_seed(10)
    a = 1 + torch.randn(5, 30, generator=g) * 0.1
    h = (1 + torch.randn(7, 3, generator=g) * 0.1).half()
    i = torch.randint(-2, 3, (5, 30), dtype=torch.int32, generator=g)

    def f(a, h, i):
        return (torch.prod(a, 1), a.prod(), torch.prod(h, 0, keepdim=True), i.prod(1),
                (a > 0.9).prod(0), torch.cumprod(a, 1), torch.cumprod(i, 0), torch.cumprod(h, 1),
                a.prod(1, dtype=torch.float64), torch.cumprod(a[0, 0], 0))  # fmt: skip

    _compile_all(f, a, h, i, dtypes={"float32", "float16", "int32"})

def test_bool_mask_selects_floats():
    # masked_fill (where + scalar_tensor), a comparison and its count, as attention masks do
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 24, generator=g, dtype=torch.float64)
    pad = torch.rand(4, 24, generator=g) > 0.5

    def f(x, pad):
        scores = x.masked_fill(pad, float("-inf"))
        keep = (x > 0.25) & ~pad
        return torch.softmax(scores, -1), torch.where(keep, x, -x * 2), keep.sum(dim=-1)

    pad[:, 0] = False  # every row keeps one score
    _compile_all(f, x, pad, dtypes={"float64", "bool"})


# ------------------------------------------------------------------------------- promotion


def test_mixed_int_float_promotion():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 16, generator=g)
    i = torch.randint(-50, 50, (5, 16), generator=g)  # int64
    j = torch.randint(1, 9, (16,), generator=g, dtype=torch.int32)
    d = torch.randn(16, generator=g, dtype=torch.float64)

    def f(x, i, j, d):
        return (
            x * i + 1,  # int64 * float32 -> float32
            i / j,  # true division of integers -> float32
            i * j + 2,  # int64 * int32 -> int64
            i + d,  # int64 + float64 -> float64
            x + d,  # float32 + float64 -> float64
            i > x,  # compared in float32 -> bool
            (i * 0.5).exp(),  # int * python float -> float32
            j.to(torch.float16) * 3,  # cast to half
            torch.where(i > 0, i, x),  # where promotes its branches -> float32
        )

    report = _compile_all(f, x, i, j, d, dtypes={"float32", "int64", "int32", "float64"})
    assert len(last_compiled().polyfuse_regions) == 1, report


def test_float_to_int_casts_truncate_toward_zero():
    x = torch.tensor([-2.7, -2.5, -0.5, 0.5, 2.5, 2.7, 1e9, -1e9], dtype=torch.float64)
    f = torch.tensor([-2.7, -0.2, 0.0, 0.2, 3.9, 7.0], dtype=torch.float32)
    _compile_all(
        lambda x, f: (
            x.to(torch.int64),
            x.to(torch.int32),
            f.to(torch.int64),
            f.to(torch.bool),
            x.to(torch.int64).to(torch.float64) - x,
        ),
        x,
        f,
        dtypes={"float64", "float32"},
    )


def test_int64_beyond_float32_precision():
    # above 2**40 float32 holds multiples of 2**17 only: a region computing in float32 would
    # round these values; int64 regions carry them exactly, as torch does
    base = 2**40 + 12345
    i = torch.tensor([[base, -base, 7], [base * 3, 1, -(2**62)]], dtype=torch.int64)

    def f(i):
        return i * 3 + 1, (i + 2**41) // 7, i.sum(dim=1), i.amax(dim=1)

    _compile_all(f, i, dtypes={"int64"})
    with torch.no_grad():
        got = torch.compile(f, backend="polyfuse")(i)
    through_float32 = (i.float() * 3 + 1).long()
    assert not torch.equal(through_float32, f(i)[0])
    assert got[0][0, 0].item() == base * 3 + 1
    # -(2**62) * 3 overflows int64: torch and polyfuse both wrap in two's complement
    assert got[0][1, 2].item() == 2**62 + 1 == f(i)[0][1, 2].item()


def test_int64_ids_gather_an_embedding():
    torch.manual_seed(5)
    table = nn.Embedding(11, 6).double().eval()
    ids = torch.tensor([[0, 10, 3], [7, 7, 1]])

    def f(ids):
        return table(ids) * 2 + table.weight[ids[:, :1] - 11].sum(dim=1, keepdim=True)

    _compile_all(f, ids, dtypes={"int64", "float64"})


# ------------------------------------------------------------------------------- fallbacks


def test_what_is_not_exact_stays_in_pytorch_with_a_warning(caplog):
    g = torch.Generator().manual_seed(6)
    a = torch.randint(-100, 100, (4, 8), generator=g)
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)

    def f(a, x):
        return torch.div(x, 0.1, rounding_mode="floor"), torch.fmod(x + 2, 0.3), (a + 1) * 3

    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="polyfuse.torch"):
        got = torch.compile(f, backend="polyfuse")(a, x)
    _same(got, f(a, x))
    report = last_compiled().polyfuse_report
    by_float = (
        "dtype float64: floor division of floats (torch corrects the rounding of a / b; "
        "polyfuse floors it)"
    )
    fmod = "dtype float64: fmod of floats (te has no float fmod)"
    assert report["eager_for_dtype"] == {
        f"aten.div.Tensor_mode ({by_float})": 1,
        f"aten.fmod.Scalar ({fmod})": 1,
    }
    # the additions around them ran in polyfuse
    assert report["polyfuse"]["aten.add.Tensor"] == 2
    [msg] = [m for m in _warnings(caplog) if "for their dtype" in m]
    assert "2 operators stay in PyTorch for their dtype" in msg
    assert by_float in msg and fmod in msg


def test_integer_division_by_a_constant_zero_stays_in_pytorch_and_raises_there(caplog):
    a = torch.arange(-6, 6).reshape(3, 4)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        (a + 1) // 0
    with (
        torch.no_grad(),
        caplog.at_level(logging.WARNING, logger="polyfuse.torch"),
        pytest.raises(RuntimeError, match="ZeroDivisionError"),
    ):
        torch.compile(lambda v: (v + 1) // 0, backend="polyfuse")(a)
    reason = "dtype int64: integer division by zero (torch raises)"
    assert any(reason in m for m in _warnings(caplog))


def test_dtypes_polyfuse_lacks_stay_in_pytorch_with_a_warning(caplog):
    x = torch.arange(-6, 6).reshape(3, 4).to(torch.complex64)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="polyfuse.torch"):
        got = torch.compile(lambda v: (v * 3 + 1).abs(), backend="polyfuse")(x)
    assert torch.equal(got, (x * 3 + 1).abs())
    reason = (
        "dtype complex64 (polyfuse stores float32, float16, bfloat16, float64, uint8, int8, "
        "int16, int32, int64, bool)"
    )
    report = last_compiled().polyfuse_report
    assert report["eager_for_dtype"] == {
        f"aten.mul.Tensor ({reason})": 1,
        f"aten.add.Tensor ({reason})": 1,
        f"aten.abs.default ({reason})": 1,
    }
    assert last_compiled().polyfuse_regions == []
    assert any("3 operators stay in PyTorch for their dtype" in m for m in _warnings(caplog))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_values_are_rounded_before_comparisons_and_integer_casts(dtype):
    # torch compares a float16 tensor with the float16 rounding of a Python number, and each
    # eager operator stores a rounded value: (x * 3) is 40.0 in float16 where float32 holds
    # 39.996, so its int conversion is 40 and ``>= 40`` holds; a fused kernel computing in
    # float32 registers rounds to the 16-bit dtype before such a discrete step
    x = (torch.tensor([0.1, 0.2, 0.0999, 13.332, 13.3359375, 1.0 / 3]) * 1).to(dtype)

    def f(x):
        y = x * 3
        return (
            x >= 0.1,
            x == 0.2,
            x < 0.2,
            y.to(torch.int32),
            y >= 40,
            y.bool(),
            y.long().sum(),
            y.float(),  # exactly the stored 16-bit value, widened
            y.double() - 40,
        )

    _compile_all(f, x, dtypes={str(dtype).removeprefix("torch.")}, exact=True)


def test_full_reductions_return_0d_tensors():
    i = torch.arange(-5, 7, dtype=torch.int32).reshape(3, 4)
    x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4)
    # _compile_all compares shapes: 0-d results come back 0-d (not shape (1,))
    _compile_all(lambda i, x: (i.sum(), (i > 0).sum(), x.mean() + i.sum()), i, x)


def test_float64_transformer_layer_with_a_bool_padding_mask_is_one_region():
    # the mask's bool -> -inf conversion (full, where) now runs in the region too
    torch.manual_seed(7)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    _compile_all(lambda x, pad: layer(x, src_key_padding_mask=pad), x, pad, dtypes={"bool"})
    assert len(last_compiled().polyfuse_regions) == 1


def test_constants_alone_make_no_region():
    # a region reading no tensor would have no device to run on: full(...) * 2, read only by
    # an operator polyfuse lacks (cummax), stays eager
    def f(x):
        c = torch.full((4,), 3, dtype=torch.int64) * 2
        return x + c.cummax(0).values

    x = torch.arange(4)
    with torch.no_grad():
        got = torch.compile(f, backend="polyfuse")(x)
    assert torch.equal(got, f(x))
    regions = last_compiled().polyfuse_regions
    assert regions and all(r.lowered.inputs for r in regions)


def test_layout_operators_keep_int_and_bool():
    i = torch.arange(24).reshape(2, 3, 4)
    b = i % 3 == 0

    def f(i, b):
        return (
            i.permute(2, 0, 1) * 2,
            i[:, 1:, ::2] + 1,
            i.transpose(0, 1).reshape(3, 8) - 1,
            i[1] + i.unsqueeze(0).expand(2, 2, 3, 4)[1],
            torch.cat([i, i + 1], 1) * 1,
            ~b[:, 1:] | b.permute(0, 1, 2)[:, :2],
            torch.cat([b, ~b], 2) & True,
        )

    _compile_all(f, i, b, dtypes={"int64", "bool"})


def test_float64_cnn_block():
    torch.manual_seed(8)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2)
    )
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    _compile_all(model.double().eval(), x, dtypes={"float64"})


def test_arange_in_a_region():
    # integer positions (a causal mask's tril decomposes to aranges) and float ranges
    def f(x):
        rows = torch.arange(4).unsqueeze(1)
        cols = torch.arange(1, 13, 2)
        causal = cols <= rows * 3
        return torch.where(causal, x, 0.0), x + torch.arange(0.0, 0.6, 0.1, dtype=torch.float64)

    _compile_all(f, torch.randn(4, 6, dtype=torch.float64), dtypes={"float64"})


def test_argmax_argmin_first_index_and_nan():
    # ties give the first index, a NaN wins (torch's rule); int64 results, dim or flattened
    nan = float("nan")
    x = torch.tensor([[1.0, 3.0, 3.0, -1.0], [nan, 2.0, nan, 9.0], [0.5, 0.5, -2.0, -2.0]])
    i = torch.tensor([[5, 7, 7, 1], [-3, -3, 0, 2]], dtype=torch.int32)

    def f(x, i):
        return (
            x.argmax(dim=1),
            x.argmin(dim=0, keepdim=True),
            (x * 2).argmax(),
            i.argmax(dim=1),
            i.argmin(dim=1, keepdim=True),
            i.argmin(),
        )

    _compile_all(f, x, i, dtypes={"float32", "int32"})


def test_integer_hardtanh_keeps_the_dtype_where_clamp_promotes():
    # hardtanh computes in the input's own dtype (bounds truncated: -0.5 -> 0, 1.7 -> 1);
    # clamp with a float bound promotes to float32
    x = torch.arange(-6, 6).reshape(3, 4)
    _compile_all(
        lambda y: (F.hardtanh(y * 2, -0.5, 1.7), torch.clamp_min(y, 0.5)), x, dtypes={"int64"}
    )


def test_integer_conv_and_pools_stay_in_pytorch_with_a_warning(caplog):
    # torch's integer average pooling truncates its division, and polyfuse's conv and pool
    # lowerings pad with float constants: integer ones stay in PyTorch, said at WARNING
    x = torch.arange(-20, 16).reshape(1, 1, 6, 6)
    w = torch.tensor([[[[1, -2, 0], [3, 1, -1], [0, 2, 1]]]])

    def f(v, w):
        y = F.conv2d(v * 3, w, padding=1)
        return F.avg_pool2d(y, 2) + 1, F.max_pool2d(y, 2, padding=1) - 1

    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="polyfuse.torch"):
        got = torch.compile(f, backend="polyfuse")(x, w)
    _same(got, f(x, w))
    report = last_compiled().polyfuse_report
    ops = ("convolution", "avg_pool2d", "max_pool2d_with_indices")
    reasons = {
        f"aten.{op}.default (dtype int64: aten.{op}.default of integers (polyfuse lowers it "
        "for floats))": 1
        for op in ops
    }
    assert report["eager_for_dtype"] == reasons
    assert report["polyfuse"] == {"aten.mul.Tensor": 1, "aten.add.Tensor": 1, "aten.sub.Tensor": 1}
    [msg] = [m for m in _warnings(caplog) if "for their dtype" in m]
    assert all(r.split(" (", 1)[1][:-1] in msg for r in reasons)


# ------------------------------------------------------------------- every dtype pair (slow)

ALL = [
    torch.int32,
    torch.int64,
    torch.bool,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "gt": torch.gt,
    "eq": torch.eq,
    "le": torch.le,
    "where": lambda a, b: torch.where(a > 0, a, b),
    "logical_and": torch.logical_and,
    "logical_xor": torch.logical_xor,
}


def _sample(dtype, shape=(3, 4)):
    g = torch.Generator().manual_seed(ALL.index(dtype))
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-9, 9, shape, generator=g, dtype=dtype)
    return (torch.randn(shape, generator=g) * 4).to(dtype)


def _agrees(fn, *args) -> str | None:
    """None when the compiled ``fn`` gives eager's dtype and values (or eager refuses the
    arguments), else what differs."""
    try:
        want = fn(*args)
    except (RuntimeError, TypeError):
        return None  # torch refuses this combination (sub of bools, a number for logical_xor)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend="polyfuse")(*args)
    try:
        _same(got, want)
    except AssertionError as e:
        return f"{[getattr(a, 'dtype', a) for a in args]}: {e}"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_operators_agree_with_eager_for_every_dtype_pair(name):
    # tensor-tensor (broadcast) and tensor-number: torch's result dtype and values, whether
    # polyfuse computes them or leaves them in PyTorch with a reason
    fn = BINARY[name]
    bad = [
        _agrees(lambda a, b: fn(a, b), _sample(da), _sample(db, (4,))) for da in ALL for db in ALL
    ]
    bad += [_agrees(lambda a, s=s: fn(a, s), _sample(d)) for d in ALL for s in (2, 0.5, True)]
    assert [b for b in bad if b] == []


def test_uint8_int8_int16_regions_compile_and_wrap_as_torch():
    # they stayed in PyTorch ("dtype uint8 (polyfuse stores ...)"); now each operator runs in
    # polyfuse with torch's dtypes and values: arithmetic wraps at the width, a Python number
    # is wrapped into the type (x_u8 > -3 compares with 253; where(..., -1) fills 255), any/all
    # of uint8 are uint8, sums count in int64, an image's bytes normalise to float32
    g = torch.Generator().manual_seed(3)
    img = torch.randint(0, 256, (2, 3, 9, 11), generator=g, dtype=torch.uint8)
    q = torch.randint(-128, 128, (2, 3, 9, 11), generator=g, dtype=torch.int8)
    m = torch.randint(-32768, 32767, (2, 3, 9, 11), generator=g, dtype=torch.int16)
    img.view(-1)[:3] = torch.tensor([0, 255, 128], dtype=torch.uint8)

    def f(img, q, m):
        x = img.float() / 255.0 - 0.5
        y = (q * 3 + 1) >> 1
        z = (q.to(torch.int16) * q) - m + (img // 3)
        fills = (torch.where(img > 3, img, -1), img > -3, img - 300, torch.clamp(img, -3, 5))
        flags = (img.any(), (img > 100).all(1), img.all(-1), q.abs() + (-q), m.sum(dim=-1))
        return (x, y, z, *fills, *flags, torch.maximum(img, 100 - img), img.max(dim=1).values)

    _compile_all(f, img, q, m, dtypes=("uint8", "int8", "int16"), exact=True)
