"""Compiled artifacts: ``fn.save(path)`` → ``polyfuse.load(path)`` runs with the runtime alone.

The loading side runs in a subprocess where islpy cannot be imported (``sys.modules['islpy'] =
None``), on the installed package (the checkout's root is not on its sys.path): it loads the
artifact, runs it on the CPU emulator and on the fake GPU driver (tests/fake_cuda.py; the
fake runs the CUDA source the saved cubin was compiled from), and the outputs must equal the
original compiled graph's bit for bit. Damaged files are refused with one-line errors.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_cuda import FakeBindings, FakeGPU

import polyfuse
import polyfuse.runner as runner_mod
from polyfuse import ops, te
from polyfuse.artifact import LoadedGraph, load, loads
from polyfuse.artifact_format import FORMAT_VERSION
from polyfuse.base.store import Store, entry_header
from polyfuse.cuda.codegen.pack import pack_parts
from polyfuse.cuda.runtime import device as device_mod
from polyfuse.cuda.runtime import select as select_mod
from polyfuse.cuda.runtime.bindings_driver import BindingsDriver
from polyfuse.cuda.runtime.launch import Launch, ScalarArg
from polyfuse.cuda.toolchain.compiler import CudaBinary, available_compilers
from polyfuse.errors import ArtifactError, CompilerNotFound
from polyfuse.runner import BufferSpec

ROOT = Path(__file__).resolve().parents[1]
needs_nvrtc = pytest.mark.skipif(not available_compilers(), reason="no CUDA compiler here")


def _three_layers():
    """Three matmul+relu layers (weights as constants) beside two independent reductions:
    Layer 3 packs the first layer with the reductions, and the two later layers are one
    deduplicated ``__global__`` function launched twice."""
    rng = np.random.default_rng(0)
    x = te.placeholder((32, 32), name="x")
    ws = [te.placeholder((32, 32), name=f"w{i}") for i in range(3)]
    h = x
    for w in ws:
        h = ops.relu(ops.matmul(h, w))
    y = te.placeholder((32, 48), name="y")
    z = te.placeholder((16, 16), name="z")
    c = ops.reduce_sum(ops.relu(y), axis=1)
    d = ops.reduce_max(ops.exp(z), axis=0)
    consts = {w: (rng.standard_normal((32, 32)) / 6).astype(np.float32) for w in ws}
    fn = polyfuse.compile([x, y, z], [h, c, d], "sm_90", constants=consts, name="three_layers")
    args = [rng.standard_normal(t.shape).astype(np.float32) for t in fn.inputs]
    return fn, args


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The compiled graph, its inputs and outputs (emulator), and its artifact on disk."""
    fn, args = _three_layers()
    want = fn(*args, device="emulate")
    path = tmp_path_factory.mktemp("art") / "three_layers.pfa"
    if available_compilers():
        fn.save(path)
    else:
        fn.save(path, archs=())
    return fn, args, want, path


RUN_WITHOUT_ISLPY = """
import os, sys
sys.modules['islpy'] = None
sys.path[:0] = [{tests!r}]  # tests/fake_cuda.py; polyfuse is the installed package
import json
import numpy as np
import polyfuse
assert polyfuse.load is polyfuse.artifact.load
g = polyfuse.load({path!r})
data = np.load({inputs!r})
args = [data[f'a{{i}}'] for i in range(len(g.inputs))]
emulated = g(*args, device='emulate')
from fake_cuda import FakeBindings, FakeGPU
from polyfuse.cuda.runtime import select as select_mod
from polyfuse.cuda.runtime.bindings_driver import BindingsDriver
gpu = FakeGPU()
gpu.images = {{b.image: g.cuda_source for b in g.binaries.values()}}
select_mod._LOADED = {{'cuda-bindings': BindingsDriver(FakeBindings(gpu))}}
os.environ['POLYFUSE_CUDA_RUNTIME'] = 'cuda-bindings'
on_gpu = g(*args, device='cuda')
compiler = sorted(m for m in sys.modules if (m == 'islpy' and sys.modules[m]) or m.startswith((
    'polyfuse.graph', 'polyfuse.stitch', 'polyfuse.driver', 'polyfuse.compiled',
    'polyfuse.plan', 'polyfuse.te', 'polyfuse.ops', 'polyfuse.cuda.codegen', 'polyfuse.poly')))
try:
    polyfuse.compile
    compile_error = ''
except ImportError as e:
    compile_error = str(e)
np.savez({out!r}, *emulated, *on_gpu)
print(json.dumps({{'compiler_modules': compiler, 'compile_error': compile_error,
    'loaded': [i.hex()[:32] for i in gpu.loaded_images]}}))
"""


def _run_without_islpy(path: Path, args: list[np.ndarray], tmp: Path) -> tuple[dict, list]:
    inputs, out = tmp / "inputs.npz", tmp / "out.npz"
    np.savez(inputs, **{f"a{i}": a for i, a in enumerate(args)})
    code = RUN_WITHOUT_ISLPY.format(tests=str(ROOT / "tests"), path=str(path),
                                    inputs=str(inputs), out=str(out))  # fmt: skip
    env = dict(os.environ, PYTHONPATH="")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env, capture_output=True,
                       text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.load(out)
    return json.loads(r.stdout.strip().splitlines()[-1]), [got[f"arr_{i}"] for i in range(len(got))]


def test_saved_graph_has_what_it_needs_to_run(saved):
    fn, _, _, path = saved
    g = load(path)
    assert [t.name for t in g.inputs] == ["x", "y", "z"]
    assert [t.shape for t in g.inputs] == [(32, 32), (32, 48), (16, 16)]
    assert [t.shape for t in g.outputs] == [t.shape for t in fn.outputs]
    assert g.launches == fn.launches and g.buffers == fn.buffers and g.arch == "sm_90"
    assert g.cuda_source == fn.cuda_source
    assert set(g.constants) == {"w0", "w1", "w2"}
    for k, a in fn.constants.items():
        assert np.array_equal(g.constants[k], a) and g.constants[k].dtype == np.float32
    # the graph has what the artifact must carry: a Layer 3 pack and a shared function
    assert any(pack_parts(k) for k in fn.kernels)
    functions = [lc.function for lc in g.launches]
    # (how many launches the pack leaves depends on the cost model's tiles and pack gains)
    assert len(functions) == len(fn.launches) and len(set(functions)) < len(functions)
    assert [k.name for k in g.kernels] == [k.name for k in fn.kernels]
    assert [k.function for k in g.kernels] == functions
    assert str(g.plan) == str(fn.plan) and "parallel stitching" in str(g.plan)
    assert [m.name for m in g.plan.micrographs] == [m.name for m in fn.plan.micrographs]
    assert len(g.plan.decisions) == len(fn.plan.records())
    assert g.versions["polyfuse"] == polyfuse.__version__
    assert g.versions["format"] == FORMAT_VERSION and "codegen" in g.versions
    if available_compilers():
        cubin = g.binaries["sm_90"]
        assert cubin.image[:4] == b"\x7fELF" and cubin.output == "cubin" and cubin.ptx
        assert set(functions) <= set(cubin.resources)


def test_loaded_without_islpy_runs_on_the_fake_gpu_and_the_emulator(saved, tmp_path):
    fn, args, want, path = saved
    info, got = _run_without_islpy(path, args, tmp_path)
    assert info["compiler_modules"] == [], info
    assert "islpy" in info["compile_error"]  # the compiler is what needs islpy
    emulated, on_gpu = got[: len(want)], got[len(want) :]
    for w, e, c in zip(want, emulated, on_gpu, strict=True):
        np.testing.assert_array_equal(e, w)
        np.testing.assert_array_equal(c, w)
    if available_compilers():  # the runtime loaded the saved sm_90 cubin
        assert info["loaded"] == [load(path).binaries["sm_90"].image.hex()[:32]]


def _fake_gpu(monkeypatch, cc=(9, 0)) -> FakeGPU:
    gpu = FakeGPU(cc=cc)
    monkeypatch.setattr(select_mod, "_LOADED", {"cuda-bindings": BindingsDriver(FakeBindings(gpu))})
    monkeypatch.setattr(device_mod, "_DEVICES", {})
    monkeypatch.setenv("POLYFUSE_CUDA_RUNTIME", "cuda-bindings")
    return gpu


SOURCE = r"""
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}

extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ out,
                                     long long n)
{
    extern __shared__ float partial[];
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    partial[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}
"""


def _scalar_graph(n: int = 300) -> LoadedGraph:
    """A hand-written graph whose launches pass scalars (float, int, long long), share one
    function between two launches and take dynamic shared memory."""
    g = ((n + 127) // 128, 1, 1)
    launches = [
        Launch("twice", g, (128, 1, 1), ("x", "t", ScalarArg(2.0, "float"), ScalarArg(n)),
               function="scale"),
        Launch("half", g, (128, 1, 1), ("t", "y", ScalarArg(0.25, "float"), ScalarArg(n)),
               function="scale"),
        Launch("block_sum", g, (128, 1, 1), ("x", "s", ScalarArg(n, "long long")), 128 * 4),
    ]  # fmt: skip
    buffers = [
        BufferSpec("x", (n,), "input"),
        BufferSpec("t", (n,), "intermediate"),
        BufferSpec("y", (n,), "output"),
        BufferSpec("s", (g[0],), "output"),
    ]
    return LoadedGraph(
        name="scalars",
        arch="sm_90",
        cuda_source=SOURCE,
        launches=launches,
        buffers=buffers,
        inputs=[("x", "x")],
        outputs=[("y", "y"), ("sums", "s")],
    )


def test_scalar_launch_args_and_shared_memory_survive_the_round_trip(tmp_path, monkeypatch):
    path = _scalar_graph().save(tmp_path / "scalars.pfa")
    g = load(path)
    assert g.launches == _scalar_graph().launches
    assert [a.ctype for a in g.launches[2].args if isinstance(a, ScalarArg)] == ["long long"]
    x = np.random.default_rng(1).standard_normal(300).astype(np.float32)
    padded = np.concatenate([x, np.zeros(84, np.float32)]).reshape(3, 128)
    y, s = g(x, device="emulate")
    np.testing.assert_allclose(y, 0.5 * x, rtol=1e-6)
    np.testing.assert_allclose(s, padded.sum(1), rtol=1e-5, atol=1e-5)
    gpu = _fake_gpu(monkeypatch)  # no cubin saved: the source is what the fake loads
    monkeypatch.setattr(
        runner_mod, "compile_cuda",
        lambda source, arch, **kw: CudaBinary(arch, "nvrtc", "cubin", source.encode(), None,
                                              {}, "", 0.0),
    )  # fmt: skip
    y2, s2 = g(x, device="cuda", out={"sums": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(s2, s)
    assert gpu.count("execute") == 3
    assert [c[2] for c in gpu.calls if c[0] == "cuFuncSetAttribute"] == []  # 512 B: no opt-in


def test_infinite_scalars_and_metadata_round_trip():
    g = _scalar_graph()
    inf = ScalarArg(float("-inf"), "float")
    g.launches[0] = Launch("twice", (3, 1, 1), (128, 1, 1), ("x", "t", inf, ScalarArg(300)))
    g.metadata = {"peak": float("inf"), "note": "x\ny"}
    back = loads(g.dumps())
    assert back.launches == g.launches and back.metadata == g.metadata


def _damaged(path: Path, tmp: Path) -> dict[str, Path]:
    data = path.read_bytes()
    head, _, body = data.partition(b"\n")
    fields = head.split(b" ")
    files = {}
    corrupt = bytearray(data)
    corrupt[len(data) - 10] ^= 0xFF  # a byte of the last blob
    files["corrupt"] = bytes(corrupt)
    files["truncated"] = data[: len(data) * 2 // 3]
    other = entry_header("artifact", FORMAT_VERSION + 1, fields[4].decode(), len(body))
    files["other version"] = other + body
    files["not an artifact"] = b"\x7fELF not an artifact at all\n" + body[:100]
    out = {}
    for name, content in files.items():
        out[name] = tmp / f"{name.replace(' ', '_')}.pfa"
        out[name].write_bytes(content)
    zoo = Store(tmp, "zoo", 1, fan_out=False)
    zoo.write_json("entry.json", {"kernels": 3})
    out["another cache's entry"] = zoo.path("entry.json")
    out["missing"] = tmp / "nope.pfa"
    return out


@pytest.mark.parametrize(
    "damage, says",
    [
        ("corrupt", "is corrupt (its SHA-256 does not match its contents)"),
        ("truncated", "is truncated ("),
        ("other version", f"has artifact format version {FORMAT_VERSION + 1}, and this polyfuse "
                          f"reads version {FORMAT_VERSION}"),
        ("not an artifact", "is not a polyfuse artifact"),
        ("another cache's entry", "is a polyfuse 'zoo' cache entry, not an artifact"),
        ("missing", "cannot read artifact"),
    ],
)  # fmt: skip
def test_damaged_or_foreign_files_are_refused_with_one_line(saved, tmp_path, damage, says):
    path = _damaged(saved[3], tmp_path)[damage]
    with pytest.raises(ArtifactError) as e:
        polyfuse.load(path)
    msg = str(e.value)
    assert says in msg and str(path) in msg and "\n" not in msg
    assert "fn.save" in msg  # what to do


def test_refusals_hold_without_islpy(saved, tmp_path):
    paths = _damaged(saved[3], tmp_path)
    code = (
        "import sys; sys.modules['islpy'] = None\n"
        "import polyfuse\n"
        f"for p in {[str(paths[k]) for k in ('corrupt', 'truncated', 'other version')]!r}:\n"
        "    try:\n        polyfuse.load(p)\n    except polyfuse.PolyfuseError as e:\n"
        "        print(type(e).__name__, e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and all(s.startswith("ArtifactError artifact '") for s in lines)


def test_a_compiled_graph_pickles_as_its_artifact(saved):
    fn, args, want, _ = saved
    fn.check_cuda(required=False)  # the cubins already built travel with the pickle
    g = pickle.loads(pickle.dumps(fn))
    assert isinstance(g, LoadedGraph) and g.name == fn.name
    assert copy.copy(fn).plan is fn.plan  # a shallow copy stays a compiled graph
    for w, got in zip(want, g(*args, device="emulate"), strict=True):
        np.testing.assert_array_equal(got, w)
    assert set(g.binaries) == {a for a, b in fn.cuda_binaries.items() if b.output == "cubin"}
    again = pickle.loads(pickle.dumps(g))  # a loaded graph pickles too
    assert again.launches == g.launches and str(again.plan) == str(fn.plan)
    assert loads(g.dumps()).cuda_source == fn.cuda_source


def test_binary_choice_follows_cubin_compatibility():
    def binary(arch):
        return CudaBinary(arch, "nvrtc", "cubin", arch.encode(), f"// ptx {arch}", {}, "", 0.0)

    g = _scalar_graph()
    g.binaries = {a: binary(a) for a in ("sm_80", "sm_90")}
    assert g.binary_for("sm_90").image == b"sm_90"
    assert g.binary_for("sm_86").image == b"sm_80"  # same major, lower minor: binary compatible
    ptx = g.binary_for("sm_100")  # no cubin of that major: the newest PTX, JIT-compiled
    assert ptx.output == "ptx" and ptx.image == b"// ptx sm_90\0"
    assert g.binary_for("sm_75") is None  # older than every image: compile the source


def test_no_cubin_and_no_compiler_says_what_to_do(monkeypatch):
    _fake_gpu(monkeypatch, cc=(7, 5))

    def no_compiler(*a, **k):
        raise CompilerNotFound("no CUDA compiler")

    monkeypatch.setattr(runner_mod, "compile_cuda", no_compiler)
    g = _scalar_graph()
    g.binaries = {"sm_90": CudaBinary("sm_90", "nvrtc", "cubin", b"x", None, {}, "", 0.0)}
    with pytest.raises(ArtifactError, match=r"no cubin for sm_75 \(it has: sm_90\).*archs="):
        g(np.zeros(300, np.float32), device="cuda")


@needs_nvrtc
def test_save_for_several_archs_or_source_only(saved, tmp_path):
    fn = saved[0]
    g = load(fn.save(tmp_path / "two.pfa", archs=["sm_80", "sm_90"], metadata={"flops": 1.5}))
    assert sorted(g.binaries) == ["sm_80", "sm_90"] and g.metadata == {"flops": 1.5}
    assert g.binaries["sm_80"].image != g.binaries["sm_90"].image
    assert load(fn.save(tmp_path / "src.pfa", archs=())).binaries == {}
    with pytest.raises(ArtifactError, match="cannot save for unknown arch 'sm_1000'"):
        fn.save(tmp_path / "bad.pfa", archs=["sm_1000"])


def test_zoo_save_writes_one_artifact_per_model(tmp_path):
    out = tmp_path / "arts"
    cmd = [sys.executable, "-m", "polyfuse", "zoo", "layer_norm", "softmax", "--no-cache",
           "--jobs", "1", "--quiet", "--no-cuda-check", "--save", str(out)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ["layer_norm.pfa", "softmax.pfa"]
    from polyfuse import examples

    for name in ("layer_norm", "softmax"):
        g = load(out / f"{name}.pfa")
        inputs, _, reference = getattr(examples, name)()
        args = examples.random_inputs(inputs, seed=4)
        got = g(*args)
        got = got if isinstance(got, tuple) else (got,)
        for a, b in zip(got, reference(*args), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert "saved" in r.stdout and str(out) in r.stdout
