"""Tests of polyfuse.cuda.runtime without a GPU.

The runtime runs against fake driver libraries (tests/fake_cuda.py) whose "device memory" is
host memory and whose kernels run in the CPU emulator, so every figure here is computed by the
same CUDA source the GPU would run: wrong parameter packing, a missing copy or a stale
pointer gives a wrong number. The tests show what issue 13 asks of the runtime: modules and
buffers made once (allocation counts), device arrays used in place (pointer equality), CUDA
graphs captured once and replayed (equal to direct launches), and the errors for mismatched
arguments (CallError naming the tensor) and driver failures (DeviceError naming the kernel).
"""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from fake_cuda import FakeBindings, FakeDeviceArray, FakeGPU, FakePycuda

from polyfuse.cuda.runtime import (
    Device,
    DeviceArray,
    DeviceProgram,
    describe,
    gpu_available,
    select_driver,
    stream_handle,
)
from polyfuse.cuda.runtime import arrays as arrays_mod
from polyfuse.cuda.runtime import select as select_mod
from polyfuse.cuda.runtime.bindings_driver import BindingsDriver
from polyfuse.cuda.runtime.launch import Launch, ScalarArg
from polyfuse.cuda.runtime.pycuda_driver import PycudaDriver
from polyfuse.cuda.toolchain.compiler import CudaBinary, available_compilers
from polyfuse.errors import CallError, DeviceError
from polyfuse.runner import load_source

HAS_GPU = gpu_available()
no_gpu_only = pytest.mark.skipif(HAS_GPU, reason="a GPU is present: no-GPU behaviour not testable")

SOURCE = r"""
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}

extern "C" __global__ void axpy(float* __restrict__ y, const float* __restrict__ x, float a, int n)
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

N = 300


@dataclass(frozen=True)
class Buf:
    name: str
    shape: tuple[int, ...]
    role: str
    dtype: str = "float32"


def source_binary(source: str = SOURCE, arch: str = "sm_90") -> CudaBinary:
    """A "binary" the fake driver loads: the source itself (it runs it in the emulator)."""
    return CudaBinary(arch, "nvrtc", "cubin", source.encode(), None, {}, "", 0.0)


def four_kernels(n: int = N) -> tuple[list[Launch], list[Buf]]:
    """x → t = 2x → t += 3x → y = t/2 (2.5 x) and s = per-block sums of x: four launches."""
    g = ((n + 127) // 128, 1, 1)
    launches = [
        Launch("scale", g, (128, 1, 1), ("x", "t", ScalarArg(2.0, "float"), ScalarArg(n))),
        Launch("axpy", g, (128, 1, 1), ("t", "x", ScalarArg(3.0, "float"), ScalarArg(n))),
        Launch("scale", g, (128, 1, 1), ("t", "y", ScalarArg(0.5, "float"), ScalarArg(n))),
        Launch("block_sum", g, (128, 1, 1), ("x", "s", ScalarArg(n)), 128 * 4),
    ]
    buffers = [
        Buf("x", (n,), "input"),
        Buf("t", (n,), "intermediate"),
        Buf("y", (n,), "output"),
        Buf("s", (g[0],), "output"),
    ]
    return launches, buffers


def expected(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = (x.size + 127) // 128
    padded = np.concatenate([x, np.zeros(blocks * 128 - x.size, np.float32)])
    return 2.5 * x, padded.reshape(blocks, 128).sum(1)


def fake_device(gpu: FakeGPU | None = None, **kw) -> tuple[Device, FakeGPU]:
    gpu = gpu or FakeGPU(**kw)
    return Device(driver=BindingsDriver(FakeBindings(gpu))), gpu


def program(dev: Device, **kw) -> DeviceProgram:
    launches, buffers = four_kernels()
    module = dev.load_binary(source_binary())
    return DeviceProgram(dev, module, launches, buffers, ["x"], ["y", "s"], **kw)


def rand(n: int = N, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


# ---- driver selection without a GPU --------------------------------------------------------


@no_gpu_only
def test_no_gpu_here():
    assert gpu_available() is False
    with pytest.raises(DeviceError) as info:
        Device()
    msg = str(info.value)
    assert "\n" not in msg and (msg.startswith("no GPU") or msg == "no CUDA device found")


def test_backend_not_installed(monkeypatch):
    monkeypatch.setattr(select_mod, "_LOADED", {})
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    with pytest.raises(DeviceError) as info:
        select_driver("pycuda")
    assert str(info.value) == "pycuda is not installed (pip install 'polyfuse[cuda]')"
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    with pytest.raises(DeviceError, match=r"cuda-bindings is not installed \(pip install"):
        select_driver("cuda-bindings")
    with pytest.raises(DeviceError) as info:
        select_driver()
    assert str(info.value).startswith("no GPU: cuda-bindings: cuda-bindings is not installed")
    assert "; pycuda: pycuda is not installed" in str(info.value)
    assert gpu_available() is False


def test_runtime_chosen_by_environment(monkeypatch):
    monkeypatch.setenv("POLYFUSE_CUDA_RUNTIME", "opencl")
    with pytest.raises(DeviceError, match="unknown CUDA runtime 'opencl'.*cuda-bindings, pycuda"):
        select_driver()
    monkeypatch.setenv("POLYFUSE_CUDA_RUNTIME", "pycuda")
    assert isinstance(select_driver(module=FakePycuda()), PycudaDriver)
    monkeypatch.setenv("POLYFUSE_CUDA_RUNTIME", "cuda-bindings")
    assert isinstance(select_driver(module=FakeBindings()), BindingsDriver)


def test_driver_initialisation_errors():
    with pytest.raises(DeviceError, match="^no CUDA device found$"):
        BindingsDriver(FakeBindings(init_error="CUDA_ERROR_NO_DEVICE"))
    with pytest.raises(DeviceError, match="^no CUDA device found$"):
        Device(driver=BindingsDriver(FakeBindings(FakeGPU(devices=0))))
    with pytest.raises(DeviceError, match="device 2 requested but only 1 found"):
        Device(2, driver=BindingsDriver(FakeBindings()))


def test_runtime_package_imports_no_driver_library():
    code = (
        "import sys, polyfuse.cuda.runtime as r; r.DeviceProgram; "
        "assert not any(m.startswith(('pycuda', 'cuda.bindings')) for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bindings_calls_match_the_real_library():
    """Every cuda.bindings call BindingsDriver makes passes the real library's argument
    conversion (without a driver the call then fails loading libcuda, not with a TypeError)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        pytest.skip("cuda-bindings is not installed")
    if HAS_GPU:
        pytest.skip("a GPU is present: tests/test_gpu.py runs the real calls")
    drv = object.__new__(BindingsDriver)
    drv.cu, drv._success = cu, cu.CUresult.CUDA_SUCCESS
    host = np.zeros(4, np.float32)
    packed = drv.pack(None, [("ptr", 4096), ("float", 1.5), ("int", 3)])
    calls = [
        lambda: drv.device_count(),
        lambda: drv.compute_capability(0),
        lambda: drv.device_name(0),
        lambda: drv.retain_primary_context(0),
        lambda: drv.set_current(cu.CUcontext(0)),
        lambda: drv.mem_alloc(64),
        lambda: drv.mem_free(4096),
        lambda: drv.memcpy_htod(4096, host, 0),
        lambda: drv.memcpy_dtoh(host, 4096, 0x1234),
        lambda: drv.memcpy_dtod(4096, 8192, 16, 0),
        lambda: drv.pointer_device(4096),
        lambda: drv.module_load(b"\x7fELF"),
        lambda: drv.module_function(cu.CUmodule(0), "k"),
        lambda: drv.set_max_dynamic_shared(cu.CUfunction(0), 100_000),
        lambda: drv.launch(cu.CUfunction(0), (1, 1, 1), (32, 1, 1), 0, 0x1234, packed),
        lambda: drv.stream_create(),
        lambda: drv.stream_synchronize(0),
        lambda: drv.event_create(),
        lambda: drv.event_record(cu.CUevent(0), 0),
        lambda: drv.stream_wait_event(0x1234, cu.CUevent(0)),
        lambda: drv.begin_capture(0x1234),
        lambda: drv.end_capture(0x1234),
        lambda: drv.graph_instantiate(cu.CUgraph(0)),
        lambda: drv.graph_launch(cu.CUgraphExec(0), 0),
    ]
    for call in calls:
        with pytest.raises(Exception) as info:
            call()
        assert not isinstance(info.value, TypeError), info.value
        assert "cuda" in str(info.value).lower() or isinstance(info.value, DeviceError)


# ---- the program: buffers and modules once, graphs replayed -------------------------------


def test_host_arrays_buffers_and_module_made_once():
    dev, gpu = fake_device()
    prog = program(dev)
    assert dev.stats.modules_loaded == 1 and gpu.count("cuModuleLoadData") == 1
    assert dev.stats.allocations == 1, "the intermediate t, allocated at construction"
    for seed in range(4):
        x = rand(seed=seed)
        y, s = prog({"x": x})
        want_y, want_s = expected(x)
        np.testing.assert_allclose(y, want_y, rtol=1e-6)
        np.testing.assert_allclose(s, want_s, rtol=1e-5, atol=1e-5)
        assert isinstance(y, np.ndarray) and y.dtype == np.float32
        # x, y and s staged once (first call); nothing allocated or freed afterwards.
        assert dev.stats.allocations == 4 and dev.stats.frees == 0
    assert gpu.count("cuModuleLoadData") == 1
    assert gpu.count("cuModuleGetFunction") == 3, "one lookup per distinct kernel"
    assert gpu.count("htod") == 4 and gpu.count("dtoh") == 8, "x in; y and s out, per call"
    assert [c[3] for c in gpu.calls if c[0] == "cuFuncSetAttribute"] == []
    prog.close()
    assert dev.stats.frees == 4 and dev.stats.live_bytes == 0


def test_cuda_graph_captured_once_and_replayed():
    dev, gpu = fake_device()
    prog = program(dev)
    x = rand()
    first = prog({"x": x})
    assert gpu.count("cuLaunchKernel") == 4 and dev.stats.graph_captures == 0
    second = prog({"x": x})  # same addresses again: captured, then launched as a graph
    assert dev.stats.graph_captures == 1 and gpu.count("cuStreamEndCapture") == 1
    assert gpu.count("capture") == 4 and gpu.count("cuGraphLaunch") == 1
    for seed in range(3):
        x = rand(seed=seed + 10)
        y, s = prog({"x": x})
        np.testing.assert_allclose(y, expected(x)[0], rtol=1e-6)
        np.testing.assert_allclose(s, expected(x)[1], rtol=1e-5, atol=1e-5)
    assert dev.stats.graph_captures == 1 and dev.stats.graph_launches == 4
    assert gpu.count("cuLaunchKernel") == 4, "no direct launch after the capture"
    # The replay computes what the direct launches computed.
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    direct = program(fake_device()[0], graphs=False)
    for seed in range(2):
        x = rand(seed=seed + 20)
        for a, b in zip(direct({"x": x}), prog({"x": x}), strict=True):
            np.testing.assert_array_equal(a, b)
    assert direct.device.stats.graph_launches == 0


def test_new_addresses_new_graph():
    dev, gpu = fake_device()
    prog = program(dev)
    xs = [FakeDeviceArray(gpu, rand(seed=i)) for i in range(2)]
    outs = [FakeDeviceArray(gpu, np.zeros(N, np.float32)) for _ in range(2)]
    for _ in range(3):
        for x, o in zip(xs, outs, strict=True):
            prog({"x": x}, {"y": o})
    assert dev.stats.graph_captures == 2, "one graph per address set, each reused"
    assert dev.stats.graph_launches == 4
    for x, o in zip(xs, outs, strict=True):
        np.testing.assert_allclose(o.numpy(), 2.5 * x.numpy(), rtol=1e-6)


# ---- device arrays: in place, outputs in the caller's framework ---------------------------


def test_device_arrays_are_used_in_place():
    dev, gpu = fake_device()
    prog = program(dev, graphs=False)
    x = FakeDeviceArray(gpu, rand())
    y_out = FakeDeviceArray(gpu, np.full(N, np.nan, np.float32))
    allocations = dev.stats.allocations
    y, s = prog({"x": x}, {"y": y_out})
    assert y is y_out
    assert isinstance(s, DeviceArray), "an output of an unknown framework: polyfuse's own"
    launches = [c for c in gpu.calls if c[0] == "cuLaunchKernel"]
    assert launches[0][2][0] == x.ptr, "kernel reads x at the caller's address"
    assert launches[2][2][1] == y_out.ptr, "kernel writes y at the caller's address"
    assert launches[3][2][1] == s.ptr
    assert gpu.count("htod") == 0 and gpu.count("dtoh") == 0, "no copies in device mode"
    assert dev.stats.allocations == allocations + 1, "only the new output s"
    np.testing.assert_allclose(y_out.numpy(), 2.5 * x.numpy(), rtol=1e-6)
    np.testing.assert_allclose(
        gpu.memory.view(s.ptr, np.float32)[: s.shape[0]],
        expected(x.numpy())[1],
        rtol=1e-5,
        atol=1e-5,
    )
    # The DeviceArray exports the protocols at the same address (no copy on the way out).
    assert describe(s).ptr == s.ptr and s.__cuda_array_interface__["data"][0] == s.ptr


def test_dlpack_capsules_read_in_place():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)

    class HostDLPack:  # a producer that has only DLPack (numpy's own export)
        def __dlpack__(self, **kw):
            return a.__dlpack__()

        def __dlpack_device__(self):
            return a.__dlpack_device__()

    info = describe(HostDLPack())
    assert info.ptr == a.ctypes.data and info.shape == (3, 4) and info.device is None
    assert info.dtype == np.float32 and info.c_contiguous
    view = a[:, ::2]
    info = describe(view)
    assert info.ptr == view.ctypes.data and not info.c_contiguous

    dev, gpu = fake_device()
    exported = DeviceArray(dev, (5, 7))
    held = arrays_mod._exports.copy()

    class DeviceDLPack:  # a DLPack-only CUDA producer (as a JAX array is to DLPack)
        def __dlpack__(self, stream=None, **kw):
            assert stream == 1, "the consumer asks for the legacy default stream"
            return exported.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return (2, 0)

    info = describe(DeviceDLPack())
    assert info.ptr == exported.ptr and info.device == 0 and info.shape == (5, 7)
    assert len(arrays_mod._exports) == len(held) + 1
    del info
    gc.collect()
    assert len(arrays_mod._exports) == len(held), "an unconsumed capsule runs its deleter"


@pytest.mark.parametrize(
    "dtype", ["float16", "bfloat16", "float32", "float64", "int32", "int64", "bool"]
)
def test_dlpack_exchange_carries_every_dtype(dtype):
    """Issue 22 item 4: a device array of each dtype exported as a DLPack capsule reads back
    with its dtype (bfloat16 is DLPack's code 4, bool code 6); bfloat16 failed before (no
    type code on export, 'dtype code 4 is not supported' on import)."""
    import ml_dtypes

    want = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    dev, gpu = fake_device()
    exported = DeviceArray(dev, (3, 5), want)

    class DeviceDLPack:
        def __dlpack__(self, stream=None, **kw):
            return exported.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return (2, 0)

    info = describe(DeviceDLPack())
    assert info.dtype == want and info.shape == (3, 5) and info.ptr == exported.ptr


def test_array_that_requires_grad_is_read_through_detach():
    """torch refuses __cuda_array_interface__ on a tensor that requires grad (RuntimeError);
    the runtime reads its detached view, at the same address."""
    gpu = FakeGPU()
    inner = FakeDeviceArray(gpu, rand(8))

    class RequiresGrad:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")

        def detach(self):
            return inner

    info = describe(RequiresGrad())
    assert info.ptr == inner.ptr and info.shape == (8,)


def test_dlpack_export_keeps_memory_until_the_consumer_is_done():
    dev, gpu = fake_device()
    a = DeviceArray(dev, (4,))
    ptr = a.ptr
    capsule = a.__dlpack__()
    del a
    gc.collect()
    assert gpu.memory.find(ptr) is not None, "the export holds the allocation"
    address = ctypes.pythonapi.PyCapsule_GetPointer(capsule, b"dltensor")
    managed = arrays_mod.DLManagedTensor.from_address(address)
    assert managed.dl_tensor.data == ptr and managed.dl_tensor.device.device_type == 2
    del capsule, managed
    gc.collect()
    assert gpu.memory.find(ptr) is None, "freed once the capsule's deleter ran"


def test_streams():
    dev, gpu = fake_device()
    prog = program(dev, graphs=False)
    s = dev.driver.stream_create()
    x = FakeDeviceArray(gpu, rand())

    class TorchLikeStream:
        cuda_stream = s

    prog({"x": x}, stream=TorchLikeStream())
    assert {c[3] for c in gpu.calls if c[0] == "cuLaunchKernel"} == {s}
    gpu.calls.clear()
    prog({"x": x})  # default stream now: must wait for the previous call on s
    assert ("cuStreamWaitEvent", 0, s) in gpu.calls
    assert stream_handle(None) == 0 and stream_handle(7) == 7
    assert stream_handle(type("S", (), {"__cuda_stream__": lambda self: (0, 99)})()) == 99
    with pytest.raises(CallError, match="not a CUDA stream"):
        stream_handle("fast")


def test_producer_stream_is_waited_for():
    dev, gpu = fake_device()
    prog = program(dev, graphs=False)
    x = FakeDeviceArray(gpu, rand())
    producer = 0x777
    cai = dict(x.__cuda_array_interface__, stream=producer)
    y_out = FakeDeviceArray(gpu, np.zeros(N, np.float32))

    class OnStream:
        __cuda_array_interface__ = cai

        def __dlpack_device__(self):
            return (2, 0)

    prog({"x": OnStream()}, {"y": y_out})
    i = gpu.calls.index(("cuEventRecord", producer))
    assert gpu.calls[i + 1] == ("cuStreamWaitEvent", 0, producer)
    assert i < next(k for k, c in enumerate(gpu.calls) if c[0] == "cuLaunchKernel")


# ---- errors --------------------------------------------------------------------------------


def test_argument_errors_name_the_tensor():
    dev, gpu = fake_device()
    prog = program(dev, labels={"x": "input_ids", "y": "hidden"})
    x = FakeDeviceArray(gpu, rand())
    with pytest.raises(
        CallError, match=r"^input 'input_ids': expected shape \(300,\), got \(3,\)$"
    ):
        prog({"x": np.zeros(3, np.float32)})
    with pytest.raises(CallError, match=r"input 'input_ids': expected float32, got float64 \(use"):
        prog({"x": np.zeros(N)})
    with pytest.raises(CallError, match="input 'input_ids': expected a numpy array or a CUDA"):
        prog({"x": [0.0] * N})
    # A host array where a device one is needed, and a device array where a host one is.
    with pytest.raises(CallError) as info:
        prog({"x": x}, {"y": np.zeros(N, np.float32)})
    assert "out 'hidden' is a numpy array (host) but input 'input_ids' is a " in str(info.value)
    assert "pass a device array on cuda:0" in str(info.value)
    with pytest.raises(CallError, match="out 'hidden' is a .*cuda:0.* but input 'input_ids' is a"):
        prog({"x": rand()}, {"y": FakeDeviceArray(gpu, np.zeros(N, np.float32))})
    strided = FakeDeviceArray(gpu, rand(2 * N))
    strided.shape, strided.strides = (N,), (8,)
    with pytest.raises(CallError, match=r"input 'input_ids': not C-contiguous \(strides \(8,\)\)"):
        prog({"x": strided})
    with pytest.raises(CallError, match="input 'input_ids' is on cuda:1 but this graph runs on"):
        prog({"x": FakeDeviceArray(gpu, rand(), device=1)})
    with pytest.raises(CallError, match="'input_ids' and 'hidden' overlap in memory"):
        prog({"x": x}, {"y": x})
    with pytest.raises(CallError, match="missing input 'input_ids'"):
        prog({})
    loose = FakeDeviceArray(gpu, rand(), dlpack_device=False)
    assert describe(loose).device == -1
    prog({"x": loose})  # the driver says where it lives
    host_memory = np.zeros(N, np.float32)

    class NotDevice:
        __cuda_array_interface__ = {
            "shape": (N,),
            "typestr": "<f4",
            "data": (host_memory.ctypes.data, False),
            "version": 2,
        }

    with pytest.raises(CallError, match="pointer 0x[0-9a-f]+ is not CUDA device memory"):
        prog({"x": NotDevice()})


def test_driver_failures_name_the_kernel():
    dev, gpu = fake_device()
    prog = program(dev)
    gpu.fail_launch["block_sum"] = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    with pytest.raises(DeviceError) as info:
        prog({"x": rand()})
    msg = str(info.value)
    assert msg.startswith("kernel block_sum: launch <<<(3, 1, 1), (128, 1, 1), 512>>> failed")
    assert "cuLaunchKernel: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" in msg and "\n" not in msg
    module = dev.load_binary(source_binary())
    launches, buffers = four_kernels()
    bad = [*launches, Launch("nope", (1, 1, 1), (1, 1, 1), ("x",))]
    with pytest.raises(CallError, match=r"kernel nope is not in the loaded module"):
        DeviceProgram(dev, module, bad, buffers, ["x"], ["y", "s"])
    too_big = [Launch("scale", (1, 1, 1), (1025, 1, 1), ("x",))]
    with pytest.raises(CallError, match="1025 threads"):
        DeviceProgram(dev, module, too_big, buffers, ["x"], ["y", "s"])
    with pytest.raises(DeviceError, match=r"cannot load cubin for sm_90 .*driver 13\.0"):
        dev.load_binary(CudaBinary("sm_90", "nvrtc", "cubin", b"\x7fELF", None, {}, "", 0.0))


def test_large_dynamic_shared_memory_opts_in():
    dev, gpu = fake_device()
    module = dev.load_binary(source_binary())
    launches, buffers = four_kernels(1024)
    launches[3] = Launch(
        "block_sum", (1, 1, 1), (1024, 1, 1), ("x", "s", ScalarArg(1024)), 96 << 10
    )
    DeviceProgram(dev, module, launches, buffers, ["x"], ["y", "s"])
    assert ("cuFuncSetAttribute", "block_sum", 8, 96 << 10) in gpu.calls
    assert sum(c[0] == "cuFuncSetAttribute" for c in gpu.calls) == 1


def test_pycuda_backend():
    gpu = FakeGPU()
    dev = Device(driver=PycudaDriver(FakePycuda(gpu)))
    assert dev.driver.name == "pycuda" and dev.arch == "sm_90"
    prog = program(dev)
    assert not prog.graphs, "pycuda launches directly"
    for seed in range(2):
        x = rand(seed=seed)
        y, s = prog({"x": x})
        np.testing.assert_allclose(y, expected(x)[0], rtol=1e-6)
        np.testing.assert_allclose(s, expected(x)[1], rtol=1e-5, atol=1e-5)
    assert dev.stats.allocations == 4 and gpu.count("cuModuleLoadData") == 1
    with pytest.raises(CallError, match="pycuda runtime launches only on streams it created"):
        prog({"x": rand()}, stream=0x5000)
    own = dev.driver.stream_create()
    prog({"x": rand()}, stream=own)


def test_load_compiles_for_the_device_arch(tmp_path, monkeypatch):
    if not available_compilers():
        pytest.skip("no CUDA compiler here")
    monkeypatch.setenv("POLYFUSE_CACHE", str(tmp_path))
    compiled = {}
    dev, gpu = fake_device(cc=(8, 9))
    monkeypatch.setattr(gpu, "load", lambda image: compiled.setdefault("image", image))
    module = load_source(dev, SOURCE)
    assert module.binary.arch == "sm_89" and module.binary.output == "cubin"
    assert set(module.binary.resources) == {"scale", "axpy", "block_sum"}
    assert compiled["image"] == module.binary.image


# ---- CompiledGraph(..., device="cuda") ------------------------------------------------------
