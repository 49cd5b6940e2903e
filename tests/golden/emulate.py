"""Run every golden graph on the CPU emulator and save (or compare) its outputs.

A change that alters the goldens' text but must keep behaviour (issue 21: "every golden kernel
runs bit-identically on the emulator before and after") is checked by running this on the old
and on the new code with the same seeded inputs:

    python tests/golden/emulate.py save /tmp/before    # on the old code
    python tests/golden/emulate.py save /tmp/after     # on the new code
    python tests/golden/emulate.py compare /tmp/before /tmp/after
    python tests/golden/emulate.py nvrtc sm_80 sm_90    # every golden .cu compiles

Inputs are seeded per graph (normal floats, small non-negative integers, random booleans),
so both runs feed the same arrays; ``compare`` demands equal bits (NaN where NaN).
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate  # noqa: E402


def _array(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """A seeded input of ``shape`` and ``dtype`` (bfloat16 through ml_dtypes)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(0, 3, shape).astype(dtype)
    x = rng.standard_normal(shape)
    if dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype)


def outputs_of(name: str, graph: generate.Graph) -> list[np.ndarray]:
    """The emulator's outputs of golden graph ``name`` on seeded inputs."""
    import polyfuse

    generate.fresh_names()
    inputs, outputs, constants = graph()
    fn = polyfuse.compile(
        inputs, outputs, constants=constants, check_cuda=False, cache=None, name=name
    )
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    args = [_array(tuple(t.shape), str(t.dtype), rng) for t in inputs]
    got = fn(*args, device="emulate")
    return list(got) if isinstance(got, (list, tuple)) else [got]


def save(folder: Path, only: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, graph in generate.graphs():
        if only and not any(a in name for a in only):
            continue
        outs = outputs_of(name, graph)
        np.savez(folder / f"{name}.npz", *[np.asarray(o) for o in outs])
        print(name, [o.shape for o in outs], flush=True)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8) if a.dtype.itemsize else a


def compare(before: Path, after: Path) -> int:
    """Print one line per graph; 1 when any output differs in a bit (or is missing)."""
    bad = 0
    for old in sorted(before.glob("*.npz")):
        new = after / old.name
        if not new.exists():
            print(f"{old.stem}: missing after")
            bad += 1
            continue
        a, b = np.load(old), np.load(new)
        same = a.files == b.files and all(
            a[k].dtype == b[k].dtype
            and a[k].shape == b[k].shape
            and np.array_equal(_bits(np.ascontiguousarray(a[k])), _bits(np.ascontiguousarray(b[k])))
            for k in a.files
        )
        print(f"{old.stem}: {'bit-identical' if same else 'DIFFERS'} ({len(a.files)} outputs)")
        bad += not same
    print(f"{bad} differ")
    return 1 if bad else 0


def nvrtc(archs: list[str]) -> int:
    """Compile every recorded golden with NVRTC for ``archs``; 1 when any fails."""
    from polyfuse.cuda.toolchain.compiler import compile_cuda

    bad = 0
    for path in sorted(HERE.glob("*.cu")):
        for arch in archs:
            try:
                compile_cuda(path.read_text(), arch, compiler="nvrtc")
            except Exception as e:  # noqa: BLE001 (report every failure, then fail)
                print(f"{path.stem} {arch}: FAILED {str(e).splitlines()[0]}")
                bad += 1
    print(f"{len(list(HERE.glob('*.cu')))} goldens x {archs}: {bad} failed")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["save"] and len(argv) >= 2:
        save(Path(argv[1]), argv[2:])
        return 0
    if argv[:1] == ["compare"] and len(argv) == 3:
        return compare(Path(argv[1]), Path(argv[2]))
    if argv[:1] == ["nvrtc"]:
        return nvrtc(argv[1:] or ["sm_80", "sm_90"])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
