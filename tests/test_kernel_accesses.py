"""Loads and stores on scoped buffers (:mod:`polyfuse.cuda.codegen.lower_accesses`): before the
pass a
statement instance is an opaque ``KStmt``; after it, its stores and loads name the buffer, the
memory scope and the index that serve each tensor, and the printer only writes them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import polyfuse
import polyfuse.cuda.codegen.lower as lower_mod
from polyfuse import ops, te
from polyfuse.cuda.codegen.body_printer import c_stores
from polyfuse.cuda.codegen.kernel_access import (
    BufferScope,
    KAllReduce,
    KBuffer,
    KCall,
    KIdx,
    KLoad,
    KOffset,
    KStore,
    KTerm,
)
from polyfuse.cuda.codegen.kernel_ast import (
    KCombine,
    KDef,
    KernelIR,
    KFor,
    KIf,
    KInt,
    KMark,
    KNode,
    KOp,
    KParam,
    KStmt,
    KVar,
    KVector,
    Scope,
)
from polyfuse.cuda.codegen.printer import emit_kernel


@pytest.fixture
def passes(monkeypatch):
    """Every (before, after) pair of the access pass while compiling (no cache, no CUDA)."""
    seen: list[tuple[KernelIR, KernelIR]] = []
    run = lower_mod.lower_accesses

    def recording(ir, *args):
        out = run(ir, *args)
        seen.append((ir, out))
        return out

    monkeypatch.setattr(lower_mod, "lower_accesses", recording)
    return seen


def _compile(inputs, outputs, name):
    return polyfuse.compile(inputs, outputs, check_cuda=False, cache=None, name=name)


def _walk(nodes) -> list[KNode]:
    out = []
    for n in nodes:
        out.append(n)
        for attr in ("body", "then", "orelse"):
            out += _walk(getattr(n, attr, ()))
    return out


def _stmts(ir: KernelIR) -> list[KStmt]:
    return [n for n in _walk(ir.body) if isinstance(n, KStmt)]


def _loads(v) -> list[KLoad]:
    """The loads inside a value expression."""
    out = [v] if isinstance(v, KLoad) else []
    if dataclasses.is_dataclass(v):
        for f in dataclasses.fields(v):
            x = getattr(v, f.name)
            for y in x if isinstance(x, tuple) else (x,):
                out += _loads(y)
    return out


def test_elementwise_statement_becomes_a_global_store_of_global_loads(passes):
    x = te.placeholder((8, 32), name="x")
    b = te.placeholder((32,), name="b")
    y = te.compute((8, 32), lambda i, j: x[i, j] * 2.0 + b[j], name="y")
    _compile([x, b], [y], "acc_ew")
    ((before, after),) = passes
    (s0,) = _stmts(before)
    assert s0.stores == ()  # before: an opaque statement instance
    (s1,) = _stmts(after)
    assert (s1.stmt, s1.args) == (s0.stmt, s0.args)
    (store,) = s1.stores
    params = {p.tensor: p.name for p in after.params}
    assert store.buffer == KBuffer(params["y"], "float32", BufferScope.GLOBAL, (8, 32))
    t0, t1 = (KIdx(a) for a in s0.args)
    assert store.index == (KOffset((KTerm(t0, None, 32), KTerm(t1))),)
    loads = _loads(store.value)
    assert [ld.buffer for ld in loads] == [
        KBuffer(params["x"], "float32", BufferScope.GLOBAL, (8, 32)),
        KBuffer(params["b"], "float32", BufferScope.GLOBAL, (32,)),
    ]
    assert loads[0].index == store.index and loads[1].index == (KOffset((KTerm(t1),)),)
    # the printer writes exactly those nodes
    text = c_stores(s1.stores)
    assert text == f"{params['y']}[t0 * 32 + t1] = (({params['x']}[t0 * 32 + t1] * 2.0f) + " \
        f"{params['b']}[t1]);"


def test_reduction_accumulates_in_local_and_combines_at_its_final_statement(passes):
    x = te.placeholder((4, 64), name="x")
    _compile([x], [ops.softmax(x, axis=-1)], "acc_softmax")
    ((_, after),) = passes
    stores = [s for n in _stmts(after) for s in n.stores]
    scopes = {s.buffer.scope for s in stores} | {
        ld.buffer.scope for s in stores for ld in _loads(s.value)
    }
    # every statement works on registers: the row's global and shared elements move
    # through the vector groups' lanes
    assert scopes == {BufferScope.LOCAL}
    combines = [s for s in stores if isinstance(s.value, KAllReduce)]
    assert len(combines) == 2  # the max and the sum, each at its final statement
    # each final statement stands in the body's combine node of its reduction, which
    # print(ir) shows around it
    nodes = [n for n in _walk(after.body) if isinstance(n, KCombine)]
    assert len({n.reduction for n in nodes}) == 2 and after.combines == tuple(nodes)
    for n in nodes:
        (stmt,) = n.body
        assert isinstance(stmt.stores[0].value, KAllReduce)
        assert (stmt.stores[0].value.form, stmt.stores[0].value.lanes) == (n.form, n.lanes)
    assert str(after).count(f"combine {nodes[0].form} ") == 2
    for s in combines:
        assert s.buffer.scope is BufferScope.LOCAL and s.buffer.name.endswith("_acc")
        assert s.value.scratch.buffer.scope is BufferScope.SHARED
        assert s.value.value == KLoad(s.buffer, (), s.value.value.dtype)
    # vector groups carry their whole-word loads and stores, one per distinct element
    vectors = [n for n in _walk(after.body) if isinstance(n, KVector)]
    assert vectors and all(v.lane_loads or v.lane_stores for v in vectors)
    for v in vectors:
        targets = [lane.target for lane in v.lane_loads]
        assert len(targets) == len(set(targets))
        assert all(lane.lanes.scope is BufferScope.LOCAL for lane in v.lane_loads)
        assert all(lane.lanes.shape == (v.width,) for lane in (*v.lane_loads, *v.lane_stores))
    moved = {lane.target.buffer.scope for v in vectors for lane in (*v.lane_loads, *v.lane_stores)}
    assert moved == {BufferScope.GLOBAL, BufferScope.SHARED}


def test_shared_placement_is_a_shared_load_with_its_box_offsets(passes):
    x = te.placeholder((4, 64), name="x")
    _compile([x], [ops.softmax(x, axis=-1)], "acc_shared")
    ((_, after),) = passes
    shared = {a.name: a for a in after.allocs if a.space.value == "shared" and a.lo}
    assert shared
    name = next(iter(shared))
    loads = [
        ld
        for n in _walk(after.body)
        if isinstance(n, KVector)
        for lane in (*n.lane_loads, *n.lane_stores)
        for ld in (lane.target,)
        if ld.buffer.name == name
    ]
    assert loads
    for ld in loads:
        assert ld.buffer.scope is BufferScope.SHARED and ld.buffer.shape == shared[name].shape
        (offset,) = ld.index
        assert [t.lo for t in offset.terms] == [
            KIdx(KVar(f"{name}_lo{d}")) for d in range(len(shared[name].shape))
        ]


def test_half_global_loads_are_widened_and_stores_rounded(passes):
    x = te.placeholder((16,), name="x", dtype="float16")
    y = te.compute((16,), lambda i: x[i] + x[i], name="y")
    _compile([x], [y], "acc_half")
    ((_, after),) = passes
    (s,) = _stmts(after)
    (store,) = s.stores
    assert store.buffer.scope is BufferScope.GLOBAL and store.buffer.dtype == "float16"
    assert isinstance(store.value, KCall) and store.value.fn == "__float2half_rn"
    widened = [v for v in (store.value.args[0].a, store.value.args[0].b)]
    assert all(isinstance(v, KCall) and v.fn == "__half2float" for v in widened)
    assert all(v.args[0].buffer.scope is BufferScope.GLOBAL for v in widened)


def test_gemm_reads_fragments_and_tiles_and_stores_its_local_tile(passes):
    a = te.placeholder((64, 64), name="a")
    b = te.placeholder((64, 64), name="b")
    c = ops.matmul(a, b)
    got = _compile([a, b], [c], "acc_gemm")
    scopes = {
        ld.buffer.scope
        for _, after in passes
        for n in _stmts(after)
        for s in n.stores
        for ld in [*_loads(s.value), KLoad(s.buffer, s.index)]
    }
    # the update reads its operands' register fragments into the local micro-tile; the
    # epilogue stores it through a staged local run (a vector store writes the global array)
    assert scopes == {BufferScope.LOCAL, BufferScope.FRAGMENT}, scopes
    xa = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    xb = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    out = got(xa, xb, device="emulate")
    out = out[0] if isinstance(out, (list, tuple)) else out
    np.testing.assert_allclose(out, xa @ xb, rtol=1e-4, atol=1e-4)


def test_print_ir_shows_buffer_scope_and_index(passes):
    x = te.placeholder((8, 32), name="x")
    y = te.compute((8, 32), lambda i, j: x[i, j] * 2.0, name="y")
    _compile([x], [y], "acc_print")
    ((_, after),) = passes
    text = str(after)
    params = {p.tensor: p.name for p in after.params}
    assert f"store global:{params['y']}<8x32>[t0 * 32 + t1] = " in text
    assert f"global:{params['x']}[t0 * 32 + t1]" in text


def test_printer_refuses_a_statement_without_its_accesses():
    ir = KernelIR("k", (), (("t0", 4),), (KStmt("S", (KVar("t0"),)),), ())
    with pytest.raises(TypeError, match="without its accesses"):
        emit_kernel(ir, [], {}, {})


def test_nodes_are_frozen_with_tuple_bodies():
    s = KStmt("S", [KVar("i")])
    loop = KFor("i", KInt(0), KOp("<", (KVar("i"), KInt(4))), 1, [s])
    branch = KIf(KVar("c"), [loop], [s])
    nodes = [
        s,
        loop,
        branch,
        KDef("v", KInt(1), [s]),
        KMark("part:a", [s]),
        KVector("c0", 4, [s], [], []),
        KCombine("y", 32, 1, Scope.WARP, "pf_scratch", "s", [s]),
        KParam("x", "const", "x"),
        KStore(KBuffer("x", "float32", BufferScope.GLOBAL, (4,)), (), KIdx(KInt(0))),
        KLoad(KBuffer("r", "float32", BufferScope.LOCAL), ()),
        KBuffer("x", "float32", BufferScope.SHARED, (4,)),
    ]
    for n in nodes:
        field = dataclasses.fields(n)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(n, field, None)
    assert s.args == (KVar("i"),) and loop.body == (s,)
    assert branch.then == (loop,) and branch.orelse == (s,)
    assert isinstance(nodes[5].body, tuple) and nodes[5].loads == ()
    assert nodes[6].body == (s,)  # the combine's body: a tuple
    hash(loop)  # frozen nodes hash (passes key tables by them)
