"""Tests of the emulator's shadow-memory race detector and of its server's death.

Each planted bug is a hand-written CUDA kernel run through a race-check build
(``Emulator.load(..., racecheck=True)``); the detector must name the kernel, the memory, both
threads and both source lines. Clean kernels (the emulator tests' shared-memory, shuffle,
atomic and cp.async kernels, and the code polyfuse generates for its examples) must pass.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from test_emulator import ATOMICS, MATMUL, NEIGHBOUR, PIPELINE, REDUCTIONS
from test_end_to_end import CASES, run_case

import polyfuse
from polyfuse import examples
from polyfuse.cuda.emulator import Emulator
from polyfuse.cuda.runtime.launch import Launch, ScalarArg
from polyfuse.errors import EmulatorError, PolyfuseError, RaceError

RNG = np.random.default_rng(1)


@pytest.fixture(scope="module")
def emu(tmp_path_factory) -> Emulator:
    return Emulator(cache_dir=tmp_path_factory.mktemp("racecache"), workers=2)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def line_of(source: str, text: str) -> int:
    """1-based line of the (unique) line of ``source`` containing ``text``."""
    (hit,) = [i + 1 for i, ln in enumerate(source.splitlines()) if text in ln]
    return hit


# --------------------------------------------------------------------------------------------
# Planted bugs
# --------------------------------------------------------------------------------------------

# y[i] = x[i + 1] within a block, through shared memory: without the barrier thread t reads
# s[t + 1] that thread t + 1 writes. Reverse order runs t + 1 first, so the result is right.
NEXT = r"""
extern "C" __global__ void next(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float s[64];
  int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  s[t] = x[i];
  SYNC;
  y[i] = t + 1 < blockDim.x ? s[t + 1] : 0.0f;
}
"""


def next_reference(x: np.ndarray) -> np.ndarray:
    blocks = x.reshape(-1, 64)
    return np.concatenate([np.append(b[1:], 0) for b in blocks])


def test_missing_barrier_found_where_reverse_order_passes(emu):
    src = "#define SYNC (void)0\n" + NEXT
    plain, checked = emu.load(src), emu.load(src, racecheck=True)
    x = rand(2 * 64)
    launch = Launch("next", (2, 1, 1), (64, 1, 1), ("x", "y"))
    y = np.zeros_like(x)
    plain.run([launch], {"x": x, "y": y}, order="reverse")
    np.testing.assert_array_equal(y, next_reference(x))  # reverse order misses this race
    with pytest.raises(RaceError) as info:
        checked.run([launch], {"x": x, "y": y}, order="reverse")
    e = info.value
    write, read = line_of(src, "s[t] = x[i]"), line_of(src, "s[t + 1]")
    assert (e.kernel, e.kind, e.space, e.memory) == ("next", "read-after-write", "shared", "s")
    # Reverse order: thread 63 writes s[63] first, then thread 62 reads it.
    # Blocks may run on different host threads: whichever reports first, both threads share it.
    (t1, b1), (t2, b2) = e.threads
    assert (t1, t2) == ((63, 0, 0), (62, 0, 0)) and b1 == b2 and b1 in ((0, 0, 0), (1, 0, 0))
    assert e.element == 63 and e.lines == (write, read)
    msg = str(e)
    assert "\n" not in msg and msg.startswith("kernel next: read-after-write race on __shared__")
    assert f"line {write}" in msg and f"line {read}" in msg and "__syncthreads()" in msg
    # In thread order the same bug is a read, then another thread's write.
    with pytest.raises(RaceError) as info:
        checked.run([launch], {"x": x, "y": y}, order="forward")
    e = info.value
    assert e.kind == "write-after-read" and e.lines == (read, write)
    (t1, b1), (t2, b2) = e.threads
    assert (t1, t2) == ((0, 0, 0), (1, 0, 0)) and b1 == b2 and b1 in ((0, 0, 0), (1, 0, 0))
    assert isinstance(e, EmulatorError) and isinstance(e, PolyfuseError)
    # With the barrier: clean in every order, and right.
    fixed = emu.load("#define SYNC __syncthreads()\n" + NEXT, racecheck=True)
    for order in ("forward", "reverse", "random"):
        y[:] = 0
        fixed.run([launch], {"x": x, "y": y}, order=order, seed=5)
        np.testing.assert_array_equal(y, next_reference(x))


# Every thread stores the same value into one shared word: right in any order, still a race.
SHARED_WAW = r"""
extern "C" __global__ void bcast(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float scale;
  int t = threadIdx.x;
  scale = x[0];
  __syncthreads();
  y[t] = scale * 2.0f;
}
"""


def test_shared_write_write(emu):
    mod = emu.load(SHARED_WAW, racecheck=True)
    x, y = rand(32), np.zeros(32, np.float32)
    with pytest.raises(RaceError) as info:
        mod.run([Launch("bcast", (1, 1, 1), (32, 1, 1), ("x", "y"))], {"x": x, "y": y})
    e = info.value
    line = line_of(SHARED_WAW, "scale = x[0]")
    assert (e.kind, e.memory, e.element, e.lines) == ("write-after-write", "scale", 0, (line, line))
    (t1, b1), (t2, b2) = e.threads
    assert (t1, t2) == ((0, 0, 0), (1, 0, 0)) and b1 == b2 == (0, 0, 0)
    fixed = emu.load(SHARED_WAW.replace("scale = x[0];", "if (t == 0) scale = x[0];"), True)
    fixed.run([Launch("bcast", (1, 1, 1), (32, 1, 1), ("x", "y"))], {"x": x, "y": y})
    np.testing.assert_array_equal(y, np.full(32, 2 * x[0], np.float32))


# Tree reduction in dynamic shared memory, missing the barrier between its steps.
TREE = r"""
extern "C" __global__ void tree(const float* __restrict__ x, float* __restrict__ out) {
  extern __shared__ float part[];
  int t = threadIdx.x;
  part[t] = x[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) part[t] += part[t + s];
    STEP;
  }
  if (t == 0) out[blockIdx.x] = part[0];
}
"""


def test_dynamic_shared_memory_race(emu):
    x, out = rand(2 * 64), np.zeros(2, np.float32)
    launch = Launch("tree", (2, 1, 1), (64, 1, 1), ("x", "o"), shared_bytes=64 * 4)
    racy = emu.load("#define STEP (void)0\n" + TREE, racecheck=True)
    with pytest.raises(RaceError) as info:
        racy.run([launch], {"x": x, "o": out})
    e = info.value
    assert (e.kernel, e.memory, e.space) == ("tree", "part", "shared")
    line = line_of("#define STEP (void)0\n" + TREE, "part[t] += part[t + s]")
    assert e.lines == (line, line) and "extern __shared__" not in str(e)
    assert f"__shared__ 'part' element {e.element}" in str(e)
    fixed = emu.load("#define STEP __syncthreads()\n" + TREE, racecheck=True)
    fixed.run([launch], {"x": x, "o": out})
    np.testing.assert_allclose(out, x.reshape(2, 64).sum(1), rtol=1e-5, atol=1e-5)


GLOBAL = r"""
// Every thread of every block stores its block's flag: threads of one block collide.
extern "C" __global__ void flag(float* __restrict__ y) {
  y[blockIdx.x] = 1.0f;
}
// One thread per block, all storing y[0]: blocks collide.
extern "C" __global__ void last_block(float* __restrict__ y) {
  y[0] = (float)blockIdx.x;
}
// Block b reads y[b + 1], which block b + 1 writes in the same launch.
extern "C" __global__ void neighbour(float* __restrict__ y) {
  float v = y[blockIdx.x + 1];
  y[blockIdx.x] = v + 1.0f;
}
// Within one block, ordered by a barrier: thread 0 writes, the others read after it.
extern "C" __global__ void ordered(float* __restrict__ y) {
  if (threadIdx.x == 0) y[0] = 3.0f;
  __syncthreads();
  y[1 + threadIdx.x] = y[0];
}
// Accumulation through atomics is not a race.
extern "C" __global__ void counted(float* __restrict__ y) {
  atomicAdd(&y[0], 1.0f);
}
"""


def test_global_write_write_across_threads(emu):
    mod = emu.load(GLOBAL, racecheck=True)
    y = np.zeros(64, np.float32)
    with pytest.raises(RaceError) as info:
        mod.run([Launch("flag", (1, 1, 1), (8, 1, 1), ("y",))], {"y": y})
    e = info.value
    line = line_of(GLOBAL, "y[blockIdx.x] = 1.0f")
    assert (e.kind, e.space, e.memory, e.element) == ("write-after-write", "global", "y", 0)
    (t1, b1), (t2, b2) = e.threads
    assert (t1, t2) == ((0, 0, 0), (1, 0, 0)) and b1 == b2 == (0, 0, 0)
    assert e.lines == (line, line)
    assert "global buffer 'y' element 0" in str(e)


def test_global_write_write_across_blocks(emu):
    mod = emu.load(GLOBAL, racecheck=True)
    y = np.zeros(64, np.float32)
    with pytest.raises(RaceError) as info:
        mod.run([Launch("last_block", (4, 1, 1), (1, 1, 1), ("y",))], {"y": y})
    e = info.value
    line = line_of(GLOBAL, "y[0] = (float)blockIdx.x")
    assert (e.kind, e.memory, e.element, e.lines) == ("write-after-write", "y", 0, (line, line))
    (t1, b1), (t2, b2) = e.threads
    assert t1 == t2 == (0, 0, 0) and b1 != b2
    assert "blocks are not ordered" in str(e)


def test_global_read_of_another_blocks_write(emu):
    mod = emu.load(GLOBAL, racecheck=True)
    y = np.zeros(64, np.float32)
    with pytest.raises(RaceError) as info:
        mod.run([Launch("neighbour", (8, 1, 1), (1, 1, 1), ("y",))], {"y": y})
    e = info.value
    read, write = line_of(GLOBAL, "float v = y[blockIdx.x + 1]"), line_of(GLOBAL, "v + 1.0f")
    assert e.kind in ("read-after-write", "write-after-read") and e.memory == "y"
    assert set(e.lines) == {read, write}


def test_barrier_ordered_global_and_atomics_are_clean(emu):
    mod = emu.load(GLOBAL, racecheck=True)
    y = np.zeros(64, np.float32)
    mod.run([Launch("ordered", (1, 1, 1), (32, 1, 1), ("y",))], {"y": y})
    assert (y[:33] == 3.0).all()
    y[:] = 0
    mod.run([Launch("counted", (4, 1, 1), (32, 1, 1), ("y",))], {"y": y})
    assert y[0] == 128
    # Launches are ordered: the same element written by two launches is not a race.
    mod.run([Launch("ordered", (1, 1, 1), (32, 1, 1), ("y",))] * 2, {"y": y})


WARP = r"""
// Lanes exchange values through shared memory, ordered by __syncwarp (one warp: clean) --
// unless the exchange crosses warps, where only __syncthreads orders it.
extern "C" __global__ void rotate(const float* __restrict__ x, float* __restrict__ y, int step) {
  __shared__ float s[64];
  int t = threadIdx.x;
  s[t] = x[t];
  __syncwarp();
  y[t] = s[(t + step) % blockDim.x];
}
"""


def test_syncwarp_orders_lanes_of_one_warp_only(emu):
    mod = emu.load(WARP, racecheck=True)
    x, y = rand(64), np.zeros(64, np.float32)
    mod.run([Launch("rotate", (1, 1, 1), (32, 1, 1), ("x", "y", ScalarArg(1)))], {"x": x, "y": y})
    np.testing.assert_array_equal(y[:32], np.roll(x[:32], -1))
    with pytest.raises(RaceError, match="kernel rotate: .* race on __shared__ 's'"):
        mod.run(
            [Launch("rotate", (1, 1, 1), (64, 1, 1), ("x", "y", ScalarArg(32)))], {"x": x, "y": y}
        )


# Warp 0's thread 0 and warp 1's thread 32 read s[5]; after a shuffle warp 0's thread 1 reads it
# too, and after a __syncwarp thread 2 writes it. The syncs order the write after warp 0's reads,
# but nothing orders it after thread 32's: a race. The shadow kept the last two readers, so
# thread 1's read replaced thread 32's and the race went unreported.
THIRD_READER = r"""
extern "C" __global__ void third(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float s[64];
  int t = threadIdx.x;
  s[t] = x[t];
  __syncthreads();
  float v = 0.0f;
  if (t == 0 || t == 32) v = s[5];
  v = __shfl_sync(0xffffffffu, v, 0);
  if (t == 1) v += s[5];
  __syncwarp();
  if (t == 2) s[5] = 7.0f;
  y[t] = v;
}
"""


def test_a_read_by_another_warp_is_kept_beside_two_readers_of_one_warp(emu):
    mod = emu.load(THIRD_READER, racecheck=True)
    x, y = rand(64), np.zeros(64, np.float32)
    with pytest.raises(RaceError) as info:
        mod.run([Launch("third", (1, 1, 1), (64, 1, 1), ("x", "y"))], {"x": x, "y": y})
    e = info.value
    assert (e.kind, e.memory, e.element) == ("write-after-read", "s", 5)
    assert e.lines == (line_of(THIRD_READER, "v = s[5]"), line_of(THIRD_READER, "s[5] = 7.0f"))
    assert [t for t, _ in e.threads] == [(32, 0, 0), (2, 0, 0)]
    # One warp alone: the shuffle and __syncwarp order all three accesses.
    mod.run([Launch("third", (1, 1, 1), (32, 1, 1), ("x", "y"))], {"x": x, "y": y})
    assert (y[:32] == x[5] + np.where(np.arange(32) == 1, x[5], 0)).all()


# --------------------------------------------------------------------------------------------
# Clean kernels
# --------------------------------------------------------------------------------------------


def test_clean_kernels_report_nothing(emu):
    """The emulator tests' correct kernels: shared tiles, shuffles, dynamic shared memory,
    block reductions, atomics, cp.async double buffering: no race, same results."""
    x = rand(6, 1000)
    out = np.zeros(6, np.float32)
    red = emu.load(REDUCTIONS, racecheck=True)
    for order in ("forward", "reverse", "random"):
        red.run(
            [Launch("row_sum", (6, 1, 1), (128, 1, 1), ("x", "o", ScalarArg(1000)))],
            {"x": x, "o": out},
            order=order,
            seed=2,
        )
        np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-4, atol=1e-4)
    y = np.zeros_like(x)
    red.run(
        [Launch("softmax", (6, 1, 1), (256, 1, 1), ("x", "y", ScalarArg(1000)))], {"x": x, "y": y}
    )
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    v, o4 = rand(1000), np.zeros(4, np.float32)
    red.run(
        [
            Launch(
                "block_sum", (4, 1, 1), (256, 1, 1), ("x", "o", ScalarArg(1000)), shared_bytes=1024
            )
        ],
        {"x": v, "o": o4},
    )
    np.testing.assert_allclose(
        o4, [v[i * 256 : (i + 1) * 256].sum() for i in range(4)], rtol=1e-5, atol=1e-5
    )

    M, N, K = 40, 36, 50
    a, b = rand(M, K), rand(K, N)
    c = np.zeros((M, N), np.float32)
    emu.load(MATMUL, racecheck=True).run(
        [Launch("matmul", (3, 3, 1), (16, 16, 1), ("a", "b", "c", *map(ScalarArg, (M, N, K))))],
        {"a": a, "b": b, "c": c},
    )
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)

    n = 3000
    s, cnt, hi = np.zeros(1, np.float32), np.zeros(1, np.int32), np.array([0, 0], np.int32)
    emu.load(ATOMICS, racecheck=True).run(
        [Launch("total", (12, 1, 1), (256, 1, 1), ("x", "s", "c", "hi", ScalarArg(n)))],
        {"x": rand(n), "s": s, "c": cnt, "hi": hi},
    )
    assert cnt[0] == n

    p = rand(3, 5 * 128)
    q = np.zeros_like(p)
    emu.load("#define WAIT 1\n" + PIPELINE, racecheck=True).run(
        [Launch("pipe_copy", (3, 1, 1), (32, 1, 1), ("x", "y", ScalarArg(5)))], {"x": p, "y": q}
    )
    np.testing.assert_array_equal(q, 2 * p)

    z = rand(4 * 128)
    emu.load("#define SYNC __syncthreads()\n" + NEIGHBOUR, racecheck=True).run(
        [Launch("shift", (4, 1, 1), (128, 1, 1), ("x", "y"))], {"x": z, "y": np.zeros_like(z)}
    )


# --------------------------------------------------------------------------------------------
# Generated kernels
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(examples.EXAMPLES))
def test_generated_examples_are_race_free(name):
    inputs, outputs, reference = examples.EXAMPLES[name].build()
    fn = polyfuse.compile(inputs=inputs, outputs=outputs, check_cuda=False, name=name)
    arrays = examples.random_inputs(inputs)
    got = fn(*arrays, race_check="shadow")  # raises RaceError on a race
    assert examples.max_error(got, reference(*arrays)) < 1e-3


def test_generated_kernel_without_its_barrier_is_reported(emu):
    """A row reduction over more lanes than a warp combines warp partials in shared memory;
    deleting the barrier between writing them and reading them back is caught, at those lines."""
    from polyfuse import te

    x = te.placeholder((37, 300), name="x")
    k = te.reduce_axis(300, name="k")
    rs = te.compute((37,), lambda i: te.sum(x[i, k], axis=k), name="rowsum")
    fn = polyfuse.compile(inputs=[x], outputs=[rs], check_cuda=False, name="rowsum")
    arrays = examples.random_inputs([x])
    np.testing.assert_allclose(fn(*arrays, race_check="shadow"), arrays[0].sum(1), rtol=1e-4)
    src = fn.cuda_source
    write = "if ((threadIdx.x & 31) == 0) scratch[warp] = v;"
    barrier = src.index("__syncthreads();", src.index(write))
    mutant = src[:barrier] + " " * len("__syncthreads();") + src[barrier + 16 :]
    with pytest.raises(RaceError) as info:
        emu.load(mutant, racecheck=True).run(fn.launches, fn._bind(arrays, {}))
    e = info.value
    assert e.kernel == fn.launches[0].kernel and e.memory == "pf_scratch"
    assert e.kind == "read-after-write" and e.space == "shared"
    assert e.lines == (line_of(src, write), line_of(src, "v = scratch[first];"))


# --------------------------------------------------------------------------------------------
# The emulator server dying
# --------------------------------------------------------------------------------------------

SPIN = r"""
extern "C" __global__ void spin(int* __restrict__ f) { while (atomicAdd(&f[0], 0) == 0) { } }
extern "C" __global__ void twice(const float* __restrict__ x, float* __restrict__ y) {
  y[threadIdx.x] = 2.0f * x[threadIdx.x];
}
"""


def test_server_killed_mid_run_raises_polyfuse_error_and_restarts(emu):
    emu = Emulator(cache_dir=emu.cache_dir, workers=1)
    mod = emu.load(SPIN)
    server = emu._server
    flag = np.zeros(1, np.int32)
    caught: list[BaseException] = []

    def hang() -> None:
        try:
            mod.run([Launch("spin", (1, 1, 1), (1, 1, 1), ("f",))], {"f": flag}, timeout=60)
        except BaseException as e:  # noqa: BLE001 -- the test inspects whatever comes out
            caught.append(e)

    th = threading.Thread(target=hang)
    th.start()
    deadline = time.monotonic() + 30
    while server.proc is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # the run is in flight
    pid = server.proc.pid
    os.kill(pid, signal.SIGKILL)
    th.join(30)
    assert not th.is_alive()
    (e,) = caught
    assert type(e) is EmulatorError, type(e)
    msg = str(e)
    assert "\n" not in msg and f"server process (pid {pid}) was killed by SIGKILL" in msg
    assert "next call" in msg and e.__cause__ is None
    # The next call starts a new server, reloading the library.
    x, y = rand(8), np.zeros(8, np.float32)
    mod.run([Launch("twice", (1, 1, 1), (8, 1, 1), ("x", "y"))], {"x": x, "y": y})
    np.testing.assert_array_equal(y, 2 * x)
    assert server.proc.pid != pid


def test_server_killed_while_idle_is_restarted(emu):
    emu = Emulator(cache_dir=emu.cache_dir, workers=1)
    mod = emu.load(SPIN)
    x, y = rand(8), np.zeros(8, np.float32)
    launch = Launch("twice", (1, 1, 1), (8, 1, 1), ("x", "y"))
    mod.run([launch], {"x": x, "y": y})
    pid = emu._server.proc.pid
    os.kill(pid, signal.SIGKILL)
    emu._server.proc.wait()
    y[:] = 0
    mod.run([launch], {"x": x, "y": y})  # a fresh server, transparently
    np.testing.assert_array_equal(y, 2 * x)
    # A library loaded after the restart gets its own module and runs too.
    os.kill(emu._server.proc.pid, signal.SIGKILL)
    other = emu.load(SPIN.replace("2.0f", "3.0f"))
    other.run([launch], {"x": x, "y": y})
    np.testing.assert_array_equal(y, 3 * x)


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_test_graphs_are_race_free(name):
    """Every end-to-end test graph, under the race detector, also matches numpy."""
    run_case(name, race_check="shadow")
