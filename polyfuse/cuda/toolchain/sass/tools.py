"""Find NVIDIA's disassembler and run it on a cubin.

Two tools print SASS, in preference order:

``nvdisasm``
    Reads a cubin directly; ``-g`` prints the source line of every instruction (when the cubin
    was compiled with ``-lineinfo``), branch targets are labels. Registry package
    ``nvidia-cuda-nvdisasm`` (``pip install 'polyfuse[sass]'``), or a CUDA toolkit.
``cuobjdump``
    ``cuobjdump -sass``; registry package ``nvidia-cuda-cuobjdump``. From CUDA 13 on it
    delegates to ``nvdisasm`` (it fails with "Could not find executable file 'nvdisasm'" without
    it), so it only helps where a CUDA 12 toolkit provides a self-contained one; it prints no
    line information.

Both are looked up in the ``nvidia`` namespace package (pip wheels: ``nvidia/cu13/bin``,
``nvidia/cuda_nvdisasm/bin``, ``nvidia/cuda_cuobjdump/bin``), on ``PATH`` and in the toolkit
roots (``$CUDA_HOME``, ``$CUDA_PATH``, ``/usr/local/cuda*``). None of this needs a GPU.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from polyfuse.base.errors import CompilerNotFound, PolyfuseError
from polyfuse.base.settings import cache_root
from polyfuse.base.store import write_atomic
from polyfuse.cuda.toolchain.toolkit import cuda_roots, nvidia_package_dirs

__all__ = [
    "INSTALL_HINT",
    "Disassembler",
    "DisassemblerNotFound",
    "DisassemblyError",
    "find_disassembler",
]

TOOLS = ("nvdisasm", "cuobjdump")
INSTALL_HINT = "pip install 'polyfuse[sass]' (nvidia-cuda-nvdisasm and nvidia-cuda-cuobjdump)"


class DisassemblerNotFound(CompilerNotFound):
    """Neither nvdisasm nor a working cuobjdump is installed."""


class DisassemblyError(PolyfuseError):
    """The disassembler rejected a cubin (or produced nothing)."""


@dataclass(frozen=True)
class Disassembler:
    """One disassembler executable: ``tool`` is ``"nvdisasm"`` or ``"cuobjdump"``."""

    tool: str
    path: str
    version: str

    @property
    def line_info(self) -> bool:
        """Whether its listing carries source lines (nvdisasm ``-g``)."""
        return self.tool == "nvdisasm"

    def __str__(self) -> str:
        return f"{self.tool} {self.version}"

    def disassemble(self, cubin: bytes) -> str:
        """The SASS listing of ``cubin`` (code sections only), cached on disk beside the
        compiled binaries (keyed by the cubin, the tool and its version)."""
        key = hashlib.sha256(cubin + f"{self.tool} {self.version}".encode()).hexdigest()
        root = cache_root()
        cached = None if root is None else root / "sass" / f"{key}.txt"
        if cached is not None and cached.is_file():
            try:
                return cached.read_text()
            except OSError:
                pass
        out = self._run(cubin)
        if cached is not None:
            try:
                write_atomic(cached, out.encode())
            except OSError:
                pass  # a read-only cache must not break the instrument
        return out

    def _run(self, cubin: bytes) -> str:
        with tempfile.TemporaryDirectory(prefix="polyfuse-sass-") as tmp:
            path = Path(tmp) / "kernel.cubin"
            path.write_bytes(cubin)
            if self.tool == "nvdisasm":
                argv = [self.path, "-c", "-g", str(path)]
            else:
                argv = [self.path, "-sass", str(path)]
            env = dict(os.environ)
            nvdisasm = _search("nvdisasm")
            if nvdisasm:  # cuobjdump (CUDA 13) delegates to nvdisasm
                env.setdefault("NVDISASM_PATH", str(Path(nvdisasm[0]).parent))
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
            except (OSError, subprocess.SubprocessError) as e:
                raise DisassemblyError(f"{self.tool} failed to run: {e}") from None
        out = proc.stdout
        if "Could not find executable file 'nvdisasm'" in proc.stderr + out:
            raise DisassemblerNotFound(f"{self} needs nvdisasm to print SASS: {INSTALL_HINT}")
        if proc.returncode != 0 or not out.strip():
            first = next((ln for ln in proc.stderr.splitlines() if ln.strip()), "no output")
            raise DisassemblyError(f"{self} could not disassemble the cubin: {first.strip()}")
        return out


def _candidates(tool: str) -> list[str]:
    """Where ``tool`` may be: the pip wheels' folders, PATH, the toolkit roots."""
    out: list[str] = []
    for base in nvidia_package_dirs():
        for sub in ("cu13", "cu12", f"cuda_{tool}"):
            out.append(str(base / sub / "bin" / tool))
    on_path = shutil.which(tool)
    if on_path:
        out.append(on_path)
    out += [str(root / "bin" / tool) for root in cuda_roots()]
    return out


def _search(tool: str) -> list[str]:
    """The executable candidates of ``tool`` that exist, in preference order."""
    seen: list[str] = []
    for path in _candidates(tool):
        if os.path.isfile(path) and os.access(path, os.X_OK) and path not in seen:
            seen.append(path)
    return seen


@functools.cache
def _version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"V(\d+\.\d+\.\d+)", out.stdout)
    return m.group(1) if m else "unknown"


def find_disassembler(tool: str | None = None) -> Disassembler:
    """The first usable disassembler (``tool`` to insist on one of :data:`TOOLS`).

    Raises :class:`DisassemblerNotFound` (a :class:`~polyfuse.base.errors.CompilerNotFound`) with
    the install command when there is none.
    """
    if tool is not None and tool not in TOOLS:
        raise ValueError(f"unknown disassembler {tool!r}; expected one of {TOOLS}")
    why = ""
    for name in [tool] if tool else TOOLS:
        found = _search(name)
        if not found:
            continue
        version = _version(found[0])
        if name == "cuobjdump" and _major(version) >= 13 and not _search("nvdisasm"):
            why = f" (cuobjdump {version} needs nvdisasm)"
            continue
        return Disassembler(name, found[0], version)
    what = tool or "nvdisasm/cuobjdump"
    raise DisassemblerNotFound(f"no SASS disassembler found ({what}){why}: {INSTALL_HINT}")


def _major(version: str) -> int:
    m = re.match(r"(\d+)\.", version)
    return int(m.group(1)) if m else 0
