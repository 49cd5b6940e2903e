"""Before/after tests of poly/footprint.py: the distinct global bytes a kernel reads and
writes, and the bytes several kernels read twice, counted by isl on small models."""

from __future__ import annotations

from poly_inputs import model_of, modelled

from polyfuse import te
from polyfuse.poly.footprint import global_footprint, read_overlap
from polyfuse.poly.placement import Placement


def _glob(*names: str, copy: tuple[str, ...] = ()) -> dict[str, Placement]:
    return {n: Placement(n, "global", "test", register_copy=n in copy) for n in names}


def _stencil():
    """``y[i, j] = x[i, j] + x[i, j + 1]`` (x 8 x 9, y 8 x 8), ``z = y * 2``."""
    x = te.placeholder((8, 9), name="x")
    y = te.compute((8, 8), lambda i, j: x[i, j] + x[i, j + 1], name="y")
    z = te.compute((8, 8), lambda i, j: y[i, j] * 2.0, name="z")
    return x, y, z


def test_distinct_elements_read_and_written_per_global_tensor():
    x, y, z = _stencil()
    _, model = modelled([x], [y, z])
    fp = global_footprint(model, _glob("x", "y", "z"))
    # x: both reads together touch all 8 x 9 elements once; y is read back by z
    assert fp.reads == {"x": 4 * 72, "y": 4 * 64}
    assert fp.writes == {"y": 4 * 64, "z": 4 * 64}
    assert fp.total == 4 * (72 + 64 + 128)


def test_on_chip_tensors_and_register_copies_move_no_global_reads():
    x, y, z = _stencil()
    _, model = modelled([x], [y, z])
    place = _glob("x", "z", "y", copy=("y",))  # y stored, its reads served from a register
    assert global_footprint(model, place).reads == {"x": 4 * 72}
    place["y"] = Placement("y", "shared", "test")
    fp = global_footprint(model, place)
    assert (fp.reads, fp.writes) == ({"x": 4 * 72}, {"z": 4 * 64})


def test_read_overlap_is_the_elements_several_kernels_read():
    x = te.placeholder((8, 16), name="x")
    top = te.compute((6, 16), lambda i, j: x[i, j] * 2.0, name="top")  # rows 0..5
    bottom = te.compute((5, 16), lambda i, j: x[i + 3, j] + 1.0, name="bottom")  # rows 3..7
    g, _ = modelled([x], [top, bottom])
    a, b = model_of(g, ["top"], 0), model_of(g, ["bottom"], 1)
    parts = [(a, _glob("x", "top")), (b, _glob("x", "bottom"))]
    assert read_overlap(parts, "x") == 4 * 3 * 16  # rows 3, 4, 5
    assert read_overlap(parts[:1], "x") == 0  # one kernel overlaps nothing
    # x in shared memory in one of them: that kernel's reads are not global
    parts[1] = (b, {"x": Placement("x", "shared", "test"), **_glob("bottom")})
    assert read_overlap(parts, "x") == 0
