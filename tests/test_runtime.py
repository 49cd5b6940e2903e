"""Tests of polyfuse.cuda.runtime: no-GPU behaviour, argument marshalling, the launch sequence.

Without a GPU (development machines, CI) the pycuda path is exercised against a fake driver
that records allocations, copies and launches and runs small Python stand-ins for the kernels.
The real-GPU test runs only where :func:`gpu_available` is true.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from polyfuse.cuda.compiler import CudaBinary, available_compilers
from polyfuse.cuda.launch import Launch, ScalarArg
from polyfuse.cuda.runtime import CudaRuntime, device_arguments, gpu_available
from polyfuse.errors import CallError, DeviceError

HAS_GPU = gpu_available()
no_gpu_only = pytest.mark.skipif(HAS_GPU, reason="a GPU is present: no-GPU behaviour not testable")

SOURCE = r"""
extern "C" __global__ void saxpy(float* __restrict__ y, const float* __restrict__ x, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ out, int n)
{
    extern __shared__ float partial[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    partial[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}
"""


def saxpy_launch(n: int, a: float = 2.0) -> Launch:
    return Launch(
        "saxpy",
        ((n + 127) // 128, 1, 1),
        (128, 1, 1),
        ("y", "x", ScalarArg(a, "float"), ScalarArg(n)),
    )


def block_sum_launch(n: int, block: int = 128) -> Launch:
    return Launch(
        "block_sum",
        ((n + block - 1) // block, 1, 1),
        (block, 1, 1),
        ("x", "out", ScalarArg(n)),
        shared_bytes=block * 4,
    )


# ---- no GPU ----------------------------------------------------------------------------------


@no_gpu_only
def test_no_gpu_here():
    assert gpu_available() is False
    with pytest.raises(DeviceError) as info:
        CudaRuntime()
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("no GPU") or msg == "no CUDA device found"
    try:
        import pycuda.driver  # noqa: F401
    except Exception:
        assert "pycuda" in msg


def test_pycuda_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    assert gpu_available() is False
    with pytest.raises(DeviceError) as info:
        CudaRuntime()
    assert str(info.value) == "no GPU: pycuda is not installed (pip install 'polyfuse[cuda]')"


def test_pycuda_without_driver(monkeypatch):
    class NoDriver:
        def find_spec(self, name, path=None, target=None):
            if name == "pycuda" or name.startswith("pycuda."):
                raise ImportError("libcuda.so.1: cannot open shared object file: No such file")
            return None

    for name in [m for m in sys.modules if m == "pycuda" or m.startswith("pycuda.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [NoDriver(), *sys.meta_path])
    assert gpu_available() is False
    with pytest.raises(DeviceError, match=r"^no GPU: pycuda could not load the CUDA driver"):
        CudaRuntime()


# ---- marshalling with a fake allocator --------------------------------------------------------


def test_device_arguments_order_and_types():
    x = np.arange(8, dtype=np.float32)
    y = np.zeros(8, dtype=np.float32)
    out = np.zeros(1, dtype=np.float32)
    launches = [
        Launch("k1", (1, 1, 1), (8, 1, 1), ("y", "x", ScalarArg(2.5, "float"), ScalarArg(8))),
        Launch("k2", (1, 1, 1), (8, 1, 1), ("x", "out", ScalarArg(1 << 40, "long long"))),
    ]
    calls = []

    def alloc(name, array):
        calls.append((name, array))
        return f"dev:{name}"

    plan = device_arguments(launches, {"x": x, "y": y, "out": out, "unused": x}, alloc)
    assert [name for name, _ in calls] == ["y", "x", "out"], "one allocation per buffer"
    assert calls[0][1] is y and calls[1][1] is x
    assert plan.allocations == {"y": "dev:y", "x": "dev:x", "out": "dev:out"}
    a1, a2 = plan.args
    assert a1[:2] == ["dev:y", "dev:x"] and a2[:2] == ["dev:x", "dev:out"]
    assert type(a1[2]) is np.float32 and a1[2] == np.float32(2.5)
    assert type(a1[3]) is np.int32 and a1[3] == 8
    assert type(a2[2]) is np.int64 and a2[2] == 1 << 40


def test_device_arguments_validates_before_allocating():
    calls = []
    launches = [
        Launch("ok", (1, 1, 1), (1, 1, 1), ("x",)),
        Launch("bad", (1, 1, 1), (1, 1, 1), ("x", "missing")),
    ]
    with pytest.raises(CallError, match="kernel bad: no buffer named 'missing'"):
        device_arguments(launches, {"x": np.zeros(4, np.float32)}, lambda n, a: calls.append(n))
    assert calls == []
    strided = np.zeros((4, 4), np.float32)[:, ::2]
    with pytest.raises(CallError, match="C-contiguous"):
        device_arguments(launches[:1], {"x": strided}, lambda n, a: calls.append(n))
    assert calls == []


# ---- the launch sequence against a fake pycuda driver ------------------------------------------


class FakeAllocation:
    def __init__(self, nbytes: int) -> None:
        self.data = bytearray(nbytes)
        self.freed = False

    def view(self, dtype) -> np.ndarray:
        return np.frombuffer(self.data, dtype=dtype)

    def free(self) -> None:
        self.freed = True


def fake_saxpy(args, grid, block, shared):
    y, x, a, n = args
    assert isinstance(a, np.float32) and isinstance(n, np.int32)
    assert grid[0] * block[0] >= n
    yv, xv = y.view(np.float32), x.view(np.float32)
    yv[:n] = a * xv[:n] + yv[:n]


def fake_block_sum(args, grid, block, shared):
    x, out, n = args
    assert shared == block[0] * 4
    xv = np.concatenate([x.view(np.float32)[:n], np.zeros(grid[0] * block[0], np.float32)])
    out.view(np.float32)[: grid[0]] = xv[: grid[0] * block[0]].reshape(grid[0], block[0]).sum(1)


class FakeDriver:
    """Just enough of ``pycuda.driver`` for :class:`CudaRuntime` and :class:`CudaModule`."""

    function_attribute = SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES=8)

    def __init__(self, devices: int = 1, cc: tuple[int, int] = (8, 6)) -> None:
        self.events: list[tuple] = []
        self.allocations: list[FakeAllocation] = []
        self.kernels = {"saxpy": fake_saxpy, "block_sum": fake_block_sum}
        driver = self

        class Device:
            @staticmethod
            def count() -> int:
                return devices

            def __init__(self, index: int) -> None:
                self.index = index

            def name(self) -> str:
                return "Fake GPU"

            def compute_capability(self) -> tuple[int, int]:
                return cc

            def retain_primary_context(self):
                return SimpleNamespace(
                    push=lambda: driver.events.append(("push",)),
                    detach=lambda: driver.events.append(("detach",)),
                )

        class Context:
            @staticmethod
            def pop() -> None:
                driver.events.append(("pop",))

            @staticmethod
            def synchronize() -> None:
                driver.events.append(("sync",))

        class Event:
            def record(self) -> None:
                pass

            def synchronize(self) -> None:
                pass

            def time_till(self, other) -> float:
                return 0.25

        self.Device, self.Context, self.Event = Device, Context, Event

    def init(self) -> None:
        self.events.append(("init",))

    def get_driver_version(self) -> int:
        return 13000

    def mem_alloc(self, nbytes: int) -> FakeAllocation:
        mem = FakeAllocation(nbytes)
        self.allocations.append(mem)
        return mem

    def memcpy_htod(self, mem: FakeAllocation, array: np.ndarray) -> None:
        self.events.append(("htod", array.nbytes))
        mem.data[: array.nbytes] = array.tobytes()

    def memcpy_dtoh(self, array: np.ndarray, mem: FakeAllocation) -> None:
        self.events.append(("dtoh", array.nbytes))
        array[...] = np.frombuffer(mem.data[: array.nbytes], array.dtype).reshape(array.shape)

    def module_from_buffer(self, image: bytes):
        if not image:
            raise RuntimeError("cuModuleLoadDataEx failed: device kernel image is invalid")
        driver = self

        class Function:
            def __init__(self, name: str) -> None:
                self.name = name

            def set_attribute(self, attr, value) -> None:
                driver.events.append(("set_attribute", self.name, attr, value))

            def __call__(self, *args, grid, block, shared):
                driver.events.append(("launch", self.name, grid, block, shared))
                driver.kernels[self.name](args, grid, block, shared)

        def get_function(name: str):
            if name not in driver.kernels:
                raise RuntimeError("cuModuleGetFunction failed: named symbol not found")
            return Function(name)

        return SimpleNamespace(get_function=get_function)


def fake_binary() -> CudaBinary:
    return CudaBinary("sm_86", "nvrtc", "cubin", b"\x7fELF...", None, {}, "", 0.0)


def test_fake_driver_device_errors():
    with pytest.raises(DeviceError, match="^no CUDA device found$"):
        CudaRuntime(driver=FakeDriver(devices=0))
    with pytest.raises(DeviceError, match="device 2 requested but only 1 found"):
        CudaRuntime(2, driver=FakeDriver())

    class NoDevice(FakeDriver):
        def init(self) -> None:
            raise RuntimeError("cuInit failed: no CUDA-capable device is detected")

    with pytest.raises(DeviceError, match="^no CUDA device found$"):
        CudaRuntime(driver=NoDevice())


def test_run_on_fake_driver():
    drv = FakeDriver()
    runtime = CudaRuntime(driver=drv)
    assert runtime.arch == "sm_86" and "Fake GPU" in repr(runtime)
    module = runtime.load_binary(fake_binary())
    n = 300
    x = np.linspace(0, 1, n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    out = np.zeros(3, dtype=np.float32)
    expected_y = 2.0 * x + y
    launches = [saxpy_launch(n), block_sum_launch(n)]
    times = module.run(launches, {"x": x, "y": y, "out": out}, timing=True)
    np.testing.assert_allclose(y, expected_y, rtol=1e-6)
    np.testing.assert_allclose(out, [x[:128].sum(), x[128:256].sum(), x[256:].sum()], rtol=1e-5)
    assert times == [0.25, 0.25]
    kinds = [e[0] for e in drv.events]
    # Uploads (y, x, out) before the launches, launches in order, one sync, downloads after.
    assert kinds.index("launch") > max(i for i, k in enumerate(kinds) if k == "htod")
    assert [e[1] for e in drv.events if e[0] == "launch"] == ["saxpy", "block_sum"]
    assert kinds.index("sync") < kinds.index("dtoh")
    assert sum(k == "dtoh" for k in kinds) == 3
    assert kinds.count("push") == kinds.count("pop")
    assert all(mem.freed for mem in drv.allocations)
    assert module.run(launches, {"x": x, "y": y, "out": out}) is None
    runtime.close()
    assert ("detach",) in drv.events


def test_large_dynamic_shared_memory_opts_in():
    drv = FakeDriver()
    module = CudaRuntime(driver=drv).load_binary(fake_binary())
    n = 1024
    x, out = np.ones(n, np.float32), np.zeros(1, np.float32)
    big = Launch("block_sum", (1, 1, 1), (1024, 1, 1), ("x", "out", ScalarArg(n)), 96 * 1024)
    drv.kernels["block_sum"] = lambda args, grid, block, shared: None
    module.run([big], {"x": x, "out": out})
    assert ("set_attribute", "block_sum", 8, 96 * 1024) in drv.events
    small = block_sum_launch(n)
    drv.events.clear()
    module.run([small], {"x": x, "out": out})
    assert not any(e[0] == "set_attribute" for e in drv.events)


def test_run_errors_on_fake_driver():
    drv = FakeDriver()
    runtime = CudaRuntime(driver=drv)
    module = runtime.load_binary(fake_binary())
    x = np.zeros(4, np.float32)
    with pytest.raises(CallError, match="kernel nope is not in the loaded module"):
        module.run([Launch("nope", (1, 1, 1), (4, 1, 1), ("x",))], {"x": x})
    with pytest.raises(CallError, match="1025 threads"):
        module.run([Launch("saxpy", (1, 1, 1), (1025, 1, 1), ("x",))], {"x": x})
    with pytest.raises(CallError, match="no buffer named 'y'"):
        module.run([saxpy_launch(4)], {"x": x})
    assert not drv.allocations, "nothing allocated for an invalid launch list"
    assert all(m.freed for m in drv.allocations)
    with pytest.raises(DeviceError, match=r"cannot load cubin for sm_86 .*driver 13\.0"):
        runtime.load_binary(CudaBinary("sm_86", "nvrtc", "cubin", b"", None, {}, "", 0.0))


def test_load_compiles_for_the_device_arch(tmp_path, monkeypatch):
    if not available_compilers():
        pytest.skip("no CUDA compiler here")
    monkeypatch.setenv("POLYFUSE_CACHE", str(tmp_path))
    module = CudaRuntime(driver=FakeDriver(cc=(8, 9))).load(SOURCE)
    assert module.binary.arch == "sm_89" and module.binary.output == "cubin"
    assert set(module.binary.resources) == {"saxpy", "block_sum"}
    assert CudaRuntime(driver=FakeDriver()).load(SOURCE, "sm_80").binary.arch == "sm_80"


def test_runtime_module_imports_without_pycuda():
    code = (
        "import sys, polyfuse.cuda.runtime as r; r.CudaModule; "
        "assert 'pycuda' not in sys.modules and 'pycuda.driver' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- a real GPU --------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_GPU, reason="no GPU (pycuda and a CUDA device are needed)")
def test_real_gpu_matches_numpy():
    rng = np.random.default_rng(0)
    n = 10_000
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    blocks = (n + 127) // 128
    out = np.zeros(blocks, np.float32)
    expected_y = 3.0 * x + y
    with CudaRuntime() as runtime:
        module = runtime.load(SOURCE)
        times = module.run(
            [saxpy_launch(n, 3.0), block_sum_launch(n)], {"x": x, "y": y, "out": out}, timing=True
        )
    np.testing.assert_allclose(y, expected_y, rtol=1e-5, atol=1e-6)
    padded = np.concatenate([x, np.zeros(blocks * 128 - n, np.float32)])
    np.testing.assert_allclose(out, padded.reshape(blocks, 128).sum(1), rtol=1e-4, atol=1e-4)
    assert times is not None and len(times) == 2 and all(t >= 0 for t in times)
