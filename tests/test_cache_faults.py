"""Cache fault tests: crashes mid-write, corrupt entries and concurrent writers never give a
wrong kernel, and every entry is healed by the next compile.

Faults in a real process are planted deterministically with ``POLYFUSE_STORE_FAULT`` (see
:mod:`polyfuse.base.store`): the compiling subprocess SIGKILLs itself right after, or in the middle
of, its N-th cache write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import polyfuse
from polyfuse import examples
from polyfuse.base.store import FORMAT, Store
from polyfuse.cache import ENTRY_VERSION, CompileCache

# compile the layer norm into the cache directory argv[1]; print the kernel sources' digest
COMPILE = """
import hashlib, sys
import polyfuse
from polyfuse import examples
from polyfuse.cache import CompileCache
ins, outs, _ = examples.layer_norm()
fn = polyfuse.compile(ins, outs, check_cuda=False, cache=CompileCache(sys.argv[1]))
print(hashlib.sha256("".join(k.source for k in fn.kernels).encode()).hexdigest())
"""


def _compile(directory: Path | None):
    ins, outs, _ = examples.layer_norm()
    cache = CompileCache(directory)
    return polyfuse.compile(ins, outs, check_cuda=False, cache=cache), cache


@pytest.fixture(scope="module")
def fresh():
    """The layer norm compiled without a disk cache: kernels and every entry it would store."""
    fn, cache = _compile(None)
    return [k.source for k in fn.kernels], cache.memory


def _entries(directory: Path) -> dict[str, Path]:
    return {p.name.removesuffix(".json"): p for p in directory.glob("*/*.json")}


def _assert_healed(directory: Path, fresh_memory: dict) -> None:
    """Every entry the compile needs is on disk, valid, and holds what a fresh compile stores."""
    store = Store(directory, "compile", ENTRY_VERSION)
    for key, want in fresh_memory.items():
        assert store.read_json(f"{key}.json") == want, f"entry {key} not healed"


def _run(directory: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("POLYFUSE_STORE_FAULT", None)
    if fault:
        env["POLYFUSE_STORE_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-c", COMPILE, str(directory)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_schedules_without_kernels_regenerate_the_fresh_kernels(tmp_path, fresh):
    """What a crash between the schedule and the kernel writes leaves (issue 9, item 3)."""
    _compile(tmp_path)
    store = Store(tmp_path, "compile", ENTRY_VERSION)
    for name, path in _entries(tmp_path).items():
        if "function" in store.read_json(f"{name}.json"):
            path.unlink()
    fn, cache = _compile(tmp_path)
    assert cache.misses >= 1
    assert [k.source for k in fn.kernels] == fresh[0]
    _assert_healed(tmp_path, fresh[1])
    ins, _, reference = examples.layer_norm()
    arrays = examples.random_inputs(ins)
    assert examples.max_error(fn(*arrays, device="emulate"), reference(*arrays)) < 1e-4  # not NaN


CORRUPTIONS = {
    "empty": lambda data: b"",
    "truncated": lambda data: data[: len(data) // 2],
    "empty dict": lambda data: b"{}",
    "plain json": lambda data: data.partition(b"\n")[2],  # the body without its header
    "wrong version": lambda data: data.replace(
        b" compile %d " % ENTRY_VERSION, b" compile %d " % (ENTRY_VERSION + 1), 1
    ),
    "wrong format": lambda data: data.replace(b"store %d " % FORMAT, b"store 999 ", 1),
    "bad checksum": lambda data: data[:-2] + bytes([data[-2] ^ 1]) + data[-1:],
    "garbage": lambda data: os.urandom(64),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_entries_are_misses_and_healed(tmp_path, fresh, corruption):
    _compile(tmp_path)
    entries = _entries(tmp_path)
    for path in entries.values():
        path.write_bytes(CORRUPTIONS[corruption](path.read_bytes()))
    fn, cache = _compile(tmp_path)
    assert cache.hits == 0 or corruption == "bad checksum" and cache.misses > 0
    assert [k.source for k in fn.kernels] == fresh[0]
    _assert_healed(tmp_path, fresh[1])
    fn, cache = _compile(tmp_path)
    assert cache.misses == 0  # healed: everything hits now


def test_valid_entry_of_the_wrong_shape_is_a_miss(tmp_path, fresh):
    """A checksummed ``{}`` (or any dict lacking the fields its use needs) is not a KeyError."""
    _compile(tmp_path)
    store = Store(tmp_path, "compile", ENTRY_VERSION)
    for name in _entries(tmp_path):
        store.write_json(f"{name}.json", {})
    fn, _ = _compile(tmp_path)
    assert [k.source for k in fn.kernels] == fresh[0]
    _assert_healed(tmp_path, fresh[1])


@pytest.mark.parametrize("fault", ["kill-after:1", "kill-after:3", "kill-during:2"])
def test_kill_9_mid_write_then_heal(tmp_path, fresh, fault):
    """The compiling process dies by SIGKILL after / in the middle of a cache write."""
    proc = _run(tmp_path, fault)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    fn, _ = _compile(tmp_path)
    assert [k.source for k in fn.kernels] == fresh[0]
    _assert_healed(tmp_path, fresh[1])


def test_two_processes_compile_into_one_directory(tmp_path, fresh):
    import hashlib

    want = hashlib.sha256("".join(fresh[0]).encode()).hexdigest()
    env = {k: v for k, v in os.environ.items() if k != "POLYFUSE_STORE_FAULT"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", COMPILE, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.strip() == want
    _assert_healed(tmp_path, fresh[1])
    assert not list(tmp_path.glob("*/*.tmp"))  # no stray temporary files


def test_store_json_round_trip_and_versions(tmp_path):
    a = Store(tmp_path, "t", 1)
    a.write_json("k", {"x": [1, 2.5, "s"]})
    assert a.read_json("k") == {"x": [1, 2.5, "s"]}
    assert Store(tmp_path, "t", 2).read_json("k") is None  # another version
    assert Store(tmp_path, "u", 1).read_json("k") is None  # another cache
    assert a.read_json("missing") is None


def test_store_artifacts_check_their_sidecar(tmp_path):
    s = Store(tmp_path, "lib", 1, fan_out=False)
    path = s.path("k-1.so")
    assert s.read_artifact("k-1.so") is None
    path.write_bytes(b"\x7fELF library")
    assert s.read_artifact("k-1.so") is None  # built, but not committed (a crash in between)
    s.commit_artifact("k-1.so")
    assert s.read_artifact("k-1.so") == path
    path.write_bytes(b"\x7fELF librar")  # truncated afterwards
    assert s.read_artifact("k-1.so") is None


# ------------------------------------------------------------------ the emulator's build cache

SQUARE = r"""
extern "C" __global__ void square_plus(const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * x[i] + x[i];
}
"""


@pytest.mark.parametrize("fault", ["truncated", "no checksum"])
def test_emulator_rebuilds_a_corrupt_library(tmp_path, fault):
    """A half-written library (a crash mid-build, or before its checksum was recorded) is
    rebuilt, not loaded."""
    import shutil

    import numpy as np

    from polyfuse.base.store import write_atomic
    from polyfuse.cuda.emulator import Emulator
    from polyfuse.cuda.runtime.launch import Launch, ScalarArg

    shared = Emulator(workers=1).cache_dir  # the server is built once, in the usual cache
    for f in shared.glob("server-*"):
        if not f.name.endswith(".lock"):
            shutil.copy(f, tmp_path / f.name)
    src = SQUARE + f"// {fault} {os.getpid()}\n"
    first = Emulator(cache_dir=tmp_path, workers=1).load(src)
    assert not first.from_cache
    lib = first.path
    if fault == "truncated":  # replaced, not overwritten: the server still maps the old file
        write_atomic(lib, lib.read_bytes()[: lib.stat().st_size // 2])
    else:
        lib.with_name(lib.name + ".sum").unlink()
    again = Emulator(cache_dir=tmp_path, workers=1).load(src)
    assert not again.from_cache  # rebuilt
    x, y = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    again.run(
        [Launch("square_plus", (1, 1, 1), (8, 1, 1), ("x", "y", ScalarArg(8)))], {"x": x, "y": y}
    )
    np.testing.assert_allclose(y, x * x + x)
    assert Emulator(cache_dir=tmp_path, workers=1).load(src).from_cache  # healed
