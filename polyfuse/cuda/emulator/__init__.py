"""Run CUDA kernels on the CPU: the same source the GPU gets, compiled as C++ by the host compiler.

:class:`Emulator` turns a CUDA translation unit into a shared library in three steps:

1. A text pre-pass (:func:`prepass`) rewrites what C++ cannot express directly, keeping line
   numbers: the pointer parameters of ``__global__`` kernels become instrumented global pointers
   (``pf_gptr<T>``: bounds-checked, recording the unique elements each launch reads and writes),
   pointer parameters of ``__device__`` functions and initialised local pointer declarations
   become ``auto``, ``__shared__`` declarations become per-block arena slots (filled with 0xFF
   bytes, so unwritten shared memory reads as NaN), ``reinterpret_cast`` becomes a version that
   understands instrumented pointers, CUDA ``#include`` lines are dropped, and one exported
   launch entry per kernel (cuLaunchKernel-like ABI) plus a module descriptor are appended.
2. ``g++ -O1 -std=c++20 -shared -fPIC -include pf_emu.h -fvisibility=hidden`` compiles it. The
   header (``rt/pf_emu.h``) maps ``threadIdx``, barriers, warp operations, cp.async,
   atomics and device math onto the runtime; the runtime (fibers, scheduler, workers:
   ``rt/pf_emu_rt.cpp``) is compiled separately, once, into a small server program, so a
   kernel library builds in well under a second; the header itself is precompiled once per
   cache (GCC's ``.gch``, :func:`~.build.precompiled_header`), a third of a small build.
   Both are cached on disk by a hash of their inputs, the flags and the compiler.
3. :meth:`EmulatedModule.run` writes the launches and buffers into a shared memfd and asks the
   server, which has loaded the library, to run them: it forks a child that executes the
   launches in order (each CUDA thread a fiber, blocks spread over worker threads) and exits.
   The parent waits with a timeout, copies results back and reads the per-launch traffic. A
   crash, bad access, divergent barrier or deadlock in a kernel becomes an
   :class:`EmulatorError` naming the kernel; the caller's process is unaffected. If the server
   itself dies (killed, out of memory), the call raises a one-line :class:`EmulatorError` and
   the next call starts a new server, which reloads the libraries.

Race check (``Emulator.load(source, racecheck=True)``, ``race_check="shadow"`` on a compiled
graph): a separate build of the library with GCC's ThreadSanitizer instrumentation
(``-fsanitize=thread``, linked without libtsan: ``pf_emu.h`` defines the ``__tsan_*`` hooks),
so every plain load and store reaches the runtime's shadow memory, like compute-sanitizer's
racecheck. Shared memory: per byte, the last writer and two readers with their barrier epoch
and ``__syncwarp`` epoch; a read of a byte another thread wrote, or a write of one another
thread read or wrote, with no ``__syncthreads`` (or, within a warp, ``__syncwarp``) between is a
race. Global memory: per element and launch, the last writer and reader; two threads of one
block conflict as in shared memory, two blocks always. Atomics never race. The first race
raises :class:`RaceError` with the kernel, the memory (``__shared__`` variable or buffer and
element), both threads and both source lines (``addr2line`` on the library's ``-g`` info).
Not seen: conflicts through raw pointers the pre-pass does not instrument (global memory
reached other than through kernel parameters), and a race hidden because an earlier
reader of the same byte was overwritten in the shadow (two readers are kept: of two different
warps whenever two warps read in the interval, each warp's newest).
A race-check run with ``banks=True`` also counts shared-memory bank conflicts per access site
(:mod:`.banks`); race-check libraries are built with ``-fno-tree-sra`` so a vector
access (``float4``) stays one 16-byte access there, as in the CUDA source.

Semantics worth knowing: a ``__syncthreads`` completes when every thread of the block waits at
the same source line; threads waiting at different lines, or some threads having exited while
others wait, is reported as divergence (stricter than some hardware tolerates). Warp operations
complete when every live lane of their mask has arrived; exited lanes leave the mask.
``__activemask()`` returns the lanes that reach the same call site together. ``cp.async``
copies capture their source at issue, poison the destination (0xFF) and land at the
``__pipeline_wait_prior`` that covers their group. Static shared memory overflow is not
checked; dynamic shared memory ends at a guard page.

Unsupported source constructs (they fail to compile or are reported): template kernels and
kernels in namespaces, ``__global__``/``__shared__``/``__device__`` hidden in function-like
macros, local pointers declared without an initialiser and later assigned a global pointer,
pointer-returning ``__device__`` functions taking global pointers, member access through a
global pointer to a struct/vector type (``p[i].x``; load the element first), C-style casts of
global pointers (use ``reinterpret_cast``), pointer-to-pointer kernel parameters, ``__half`` and
other fp16/bf16 types, cooperative groups, ``cuda::pipeline``/``cuda::barrier``, inline PTX,
dynamic parallelism, texture/surface objects, ``__constant__`` symbols set from the host,
spin-waits on other blocks (blocks run to completion one after another per worker).
``auto v = p[i];`` binds a lazy reference to global memory rather than a value.

Modules: :mod:`.prepass` (step 1), :mod:`.build` (step 2, compiling and
caching), :mod:`.wire` and :mod:`.server` (step 3: the request format and
the server process), :mod:`.races` (race reports), :mod:`.banks` (bank
reports); this one is the public API.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyfuse.base.errors import CallError, EmulatorError
from polyfuse.base.store import write_atomic
from polyfuse.cuda.runtime.launch import Launch, LaunchTraffic, marshal

from .banks import decode_banks
from .build import (
    KERNEL_FLAGS,
    RACECHECK_FLAGS,
    RT_DIR,
    RUNTIME_SOURCE,
    SERVER_FLAGS,
    build_key,
    cached_build,
    compile_cxx,
    compiler_id,
    default_cache_dir,
    find_compiler,
    precompiled_header,
)
from .prepass import prepass
from .races import race_error
from .server import server_for
from .wire import (
    ABI_VERSION,
    ARG,
    BANK_CAP,
    BANK_HEADER,
    BANK_STAT,
    BUF,
    LAUNCH,
    ORDERS,
    RESULT_HEADER,
    SPEC,
    align,
)

__all__ = ["Emulator", "EmulatedModule", "KernelSignature", "prepass"]


@dataclass(frozen=True)
class KernelSignature:
    """A kernel parameter list as the compiled library reports it.

    Each parameter is ``(pointer, kind, size)``: ``pointer`` is True for a global buffer,
    ``kind`` one of ``f`` (floating), ``g`` (bfloat16), ``i`` (signed), ``u`` (unsigned),
    ``b`` (bool), ``v`` (other) and ``size`` the byte size of the value or pointee.
    """

    params: tuple[tuple[bool, str, int], ...]

    @classmethod
    def parse(cls, sig: str) -> KernelSignature:
        params = []
        for tok in filter(None, sig.split(",")):
            params.append((tok[0] == "p", tok[1], int(tok[2:])))
        return cls(tuple(params))


_SCALAR_KIND = {"int": ("i", 4), "long long": ("i", 8), "float": ("f", 4)}
_ARRAY_KIND = {"f": "f", "i": "i", "u": "u", "b": "b"}  # numpy kinds (bfloat16 is "g")


class EmulatedModule:
    """A CUDA translation unit compiled for the CPU emulator (see :meth:`Emulator.load`)."""

    def __init__(
        self,
        emulator: Emulator,
        path: Path,
        from_cache: bool,
        module: int,
        text: str,
        racecheck: bool = False,
        shared: tuple[Sequence[tuple[str, str]], Sequence[tuple[str, str]]] = ((), ()),
    ):
        self.emulator = emulator
        #: The compiled library.
        self.path = path
        #: True when the library came from the disk cache (no compiler ran).
        self.from_cache = from_cache
        #: True for a race-check build: every run also checks for data races (RaceError).
        self.racecheck = racecheck
        #: (name, type) of the static __shared__ sites and of the extern __shared__ arrays.
        self._shared, self._dynamic = tuple(shared[0]), tuple(shared[1])
        self._module = module
        self._kernels: dict[str, tuple[int, KernelSignature]] = {}
        for i, line in enumerate(text.splitlines()):
            name, _, sig = line.partition(" ")
            self._kernels[name] = (i, KernelSignature.parse(sig))

    @property
    def kernel_names(self) -> list[str]:
        """Names of the ``__global__`` kernels defined by the source, in source order."""
        return list(self._kernels)

    def signature(self, kernel: str) -> KernelSignature:
        """The parameter signature of ``kernel``."""
        return self._kernels[kernel][1]

    def _check(self, launch: Launch, values: list) -> int:
        if launch.entry not in self._kernels:
            raise CallError(
                f"kernel {launch.entry}: not defined by this source (it has "
                f"{', '.join(self._kernels) or 'no kernels'})"
            )
        index, sig = self._kernels[launch.entry]
        if len(values) != len(sig.params):
            raise CallError(
                f"kernel {launch.kernel}: takes {len(sig.params)} arguments, launch passes "
                f"{len(values)}"
            )
        for i, (arg, (pointer, kind, size)) in enumerate(zip(launch.args, sig.params, strict=True)):
            if pointer:
                if not isinstance(arg, str):
                    raise CallError(f"kernel {launch.kernel}: argument {i} must be a buffer")
                arr = values[i]
                ak = "g" if arr.dtype.name == "bfloat16" else _ARRAY_KIND.get(arr.dtype.kind, "v")
                if arr.itemsize & (arr.itemsize - 1) or (
                    kind != "v" and (ak != kind or arr.itemsize != size)
                ):
                    raise CallError(
                        f"kernel {launch.kernel}: buffer '{arg}' has dtype {arr.dtype}, the "
                        f"kernel's parameter {i} points to a {size}-byte '{kind}' type"
                    )
            else:
                if isinstance(arg, str):
                    raise CallError(
                        f"kernel {launch.kernel}: argument {i} is a scalar, got buffer '{arg}'"
                    )
                sk, ss = _SCALAR_KIND[arg.ctype]
                ints = {"i", "u", "b"}
                if ss != size or (sk != kind and not (sk in ints and kind in ints)):
                    raise CallError(
                        f"kernel {launch.kernel}: argument {i} is a {size}-byte '{kind}' "
                        f"scalar, got ScalarArg({arg.value!r}, {arg.ctype!r})"
                    )
        return index

    def run(
        self,
        launches: Sequence[Launch],
        buffers: dict[str, np.ndarray],
        order: str = "forward",
        seed: int = 0,
        timeout: float = 600.0,
        banks: bool = False,
    ) -> list[LaunchTraffic]:
        """Execute ``launches`` in sequence on ``buffers`` (updated in place); return the traffic.

        ``order`` is how each block's threads are scheduled between barriers: "forward" (thread
        order), "reverse" (a missing barrier shows as a wrong result) or "random" (shuffled with
        ``seed``). The launches run in a child process; a crash, out-of-bounds access, divergent
        barrier or deadlock raises :class:`EmulatorError` naming the kernel, as does exceeding
        ``timeout`` seconds; ``buffers`` are then left unchanged. The traffic of each launch
        lists, for every buffer argument, the unique elements read and written × item size, and
        the bytes requested (every load and store, repeats included).
        A race-check module (``Emulator.load(..., racecheck=True)``) raises :class:`RaceError`
        at the first pair of conflicting accesses (see :mod:`.races`).
        ``banks`` (race-check modules only) also counts shared-memory bank conflicts per
        access site: each launch's traffic then lists them in ``shared_banks``
        (:class:`~polyfuse.cuda.emulator.banks.BankAccess`).
        """
        if banks and not self.racecheck:
            raise CallError(
                "banks=True needs a race-check module (Emulator.load(source, racecheck=True)): "
                "only its instrumentation sees every shared-memory access"
            )
        if order not in ORDERS:
            raise CallError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
        launches = list(launches)
        if not launches:
            return []
        names: dict[str, int] = {}
        plan = []
        for launch in launches:
            values = marshal(launch, buffers)
            index = self._check(launch, values)
            for a in launch.args:
                if isinstance(a, str) and a not in names:
                    names[a] = len(names)
            plan.append((index, launch, values))
        arrays = [buffers[n] for n in names]
        nb, nl = len(arrays), len(launches)
        nargs = sum(len(lc.args) for lc in launches)
        name_bytes = [n.encode() + b"\0" for n in names]
        # Layout: spec | buffer table | launch table | arguments | names | result | data.
        bufs_off = align(SPEC.itemsize)
        launches_off = align(bufs_off + BUF.itemsize * nb)
        args_off = align(launches_off + LAUNCH.itemsize * nl)
        names_off = align(args_off + ARG.itemsize * nargs)
        result_off = align(names_off + sum(map(len, name_bytes)))
        counts_off = result_off + RESULT_HEADER
        banks_off = align(counts_off + 32 * nl * nb) if banks else 0
        pos = align(banks_off + BANK_HEADER + BANK_STAT.itemsize * BANK_CAP) if banks else (
            align(counts_off + 32 * nl * nb)
        )
        data_offs = []
        for a in arrays:
            data_offs.append(pos)
            pos = align(pos + a.nbytes)
        emu = self.emulator
        with emu._server.lock:
            view = emu._server.region(pos)
            spec = view[: SPEC.itemsize].view(SPEC)[0]
            spec["abi"], spec["nbuf"], spec["nlaunch"] = ABI_VERSION, nb, nl
            spec["order"], spec["seed"] = ORDERS[order], seed & (2**64 - 1)
            spec["workers"], spec["module"] = emu.workers, self._module
            spec["bufs_off"], spec["launches_off"], spec["result_off"] = (
                bufs_off,
                launches_off,
                result_off,
            )
            spec["banks_off"], spec["banks_cap"] = banks_off, BANK_CAP if banks else 0
            if banks:
                view[banks_off : banks_off + BANK_HEADER] = 0
            btab = view[bufs_off : bufs_off + BUF.itemsize * nb].view(BUF)
            npos = names_off
            for i, (a, nm, off) in enumerate(zip(arrays, name_bytes, data_offs, strict=True)):
                btab[i] = (off, a.nbytes, a.itemsize, 0, npos)
                view[npos : npos + len(nm)] = np.frombuffer(nm, np.uint8)
                npos += len(nm)
                view[off : off + a.nbytes] = a.reshape(-1).view(np.uint8)
            ltab = view[launches_off : launches_off + LAUNCH.itemsize * nl].view(LAUNCH)
            atab = view[args_off : args_off + ARG.itemsize * nargs].view(ARG)
            k = 0
            for i, (index, launch, values) in enumerate(plan):
                n = len(values)
                ltab[i] = (
                    index,
                    n,
                    launch.grid,
                    launch.block,
                    launch.shared_bytes,
                    0,
                    args_off + 16 * k,
                )
                for arg, v in zip(launch.args, values, strict=True):
                    if isinstance(arg, str):
                        atab[k] = (names[arg], 0, 0)
                    else:
                        atab[k] = (-1, 0, int.from_bytes(v.tobytes().ljust(8, b"\0"), "little"))
                    k += 1
            view[result_off:counts_off] = 0
            counts = view[counts_off : counts_off + 32 * nl * nb].view(np.int64)
            counts[:] = -1
            kernels = list(dict.fromkeys(lc.kernel for lc in launches))
            what = f"kernel{'s' if len(kernels) > 1 else ''} {', '.join(kernels[:4])}" + (
                ", ..." if len(kernels) > 4 else ""
            )
            status, timed_out = emu._server.run(0, timeout, what)
            res = view[result_off:counts_off]
            res_status, current = (int(x) for x in res[:8].view(np.int32))
            if res_status == 5:
                raise race_error(
                    self.path,
                    self._shared,
                    self._dynamic,
                    bytes(res[8:]),
                    [(n, a.itemsize) for n, a in zip(names, arrays, strict=True)],
                    launches[current] if 0 <= current < nl else None,
                )
            if timed_out or res_status != 1 or status != 0:
                name = launches[min(max(current, 0), nl - 1)].kernel if launches else "?"
                if timed_out:
                    raise EmulatorError(
                        f"kernel {name}: timed out after {timeout:g} s (a hung kernel, a "
                        "spin-wait across blocks, or a launch too large for the emulator)"
                    )
                raise EmulatorError(_failure(res, res_status, status, name))
            traffic = []
            written = [False] * nb
            c = counts.reshape(nl, max(1, nb), 4) if nb else None
            for i, launch in enumerate(launches):
                t = LaunchTraffic(launch.kernel)
                for a in launch.args:
                    if isinstance(a, str) and a not in t.reads:
                        assert c is not None
                        r, w, rq, wq = (max(0, int(x)) for x in c[i, names[a]])
                        t.reads[a], t.writes[a] = r, w
                        t.requested_reads[a], t.requested_writes[a] = rq, wq
                        written[names[a]] |= w > 0
                traffic.append(t)
            if banks:
                raw = view[banks_off : banks_off + BANK_HEADER + BANK_STAT.itemsize * BANK_CAP]
                for t, sites in zip(traffic, decode_banks(self.path, raw, nl), strict=True):
                    t.shared_banks = sites
            for a, off, w in zip(arrays, data_offs, written, strict=True):
                if w:
                    a.reshape(-1).view(np.uint8)[:] = view[off : off + a.nbytes]
            return traffic


def _failure(res: np.ndarray, res_status: int, status: int, name: str) -> str:
    if res_status in (3, 4):
        return bytes(res[8:]).split(b"\0", 1)[0].decode(errors="replace")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            sname = signal.Signals(sig).name
        except ValueError:
            sname = str(sig)
        return f"kernel {name}: the emulator's run process was killed by {sname}"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return f"kernel {name}: the emulator's run process exited with status {code} before finishing"


class Emulator:
    """Compiles CUDA translation units for the CPU and runs their kernels (see module docs).

    ``cache_dir`` holds compiled libraries (default ``$POLYFUSE_CACHE/emulator`` or
    ``~/.cache/polyfuse/emulator``; ``POLYFUSE_CACHE=off`` uses a temporary directory);
    ``workers`` is the number of OS threads blocks are spread over (default: CPU count).
    Raises :class:`CompilerNotFound` when no C++20 compiler is available. Kernels run in a
    small server process (one per server executable, shared by the emulators of this process,
    started on first use and stopped at exit).
    """

    def __init__(self, cache_dir: str | os.PathLike | None = None, workers: int | None = None):
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.workers = int(workers) if workers else (os.cpu_count() or 1)
        if self.workers < 1:
            raise CallError("workers must be at least 1")
        self.cxx = find_compiler()
        self._cxx_id = compiler_id(self.cxx)
        # the header and what it includes: a change to either rebuilds every library
        self._header = "".join(h.read_text() for h in sorted(RT_DIR.glob("*.h")))
        self._modules: dict[str, EmulatedModule] = {}
        self._includes: dict[bool, Path] = {}  # racecheck -> the header to -include
        self._lock = threading.RLock()
        self._server = server_for(self._build_server())

    def _build_server(self) -> Path:
        src = RUNTIME_SOURCE.read_text()
        key = build_key(
            "server", str(ABI_VERSION), self._cxx_id, " ".join(SERVER_FLAGS), self._header, src
        )
        return cached_build(
            self.cache_dir,
            f"server-{key}",
            lambda out: compile_cxx(
                self.cxx, SERVER_FLAGS, RUNTIME_SOURCE, out, ["-I", str(RT_DIR), "-ldl"]
            ),
        )[0]

    def _include(self, racecheck: bool) -> Path:
        """The header a kernel build ``-include``s: its precompiled form where the compiler
        makes one (built once per cache, then once per emulator)."""
        if racecheck not in self._includes:
            flags = RACECHECK_FLAGS if racecheck else KERNEL_FLAGS
            self._includes[racecheck] = precompiled_header(
                self.cache_dir, self.cxx, self._cxx_id, flags, self._header
            )
        return self._includes[racecheck]

    def load(self, source: str, racecheck: bool = False) -> EmulatedModule:
        """Compile (or take from the cache) the CUDA translation unit ``source``.

        ``racecheck`` builds the race-check variant (a separate library, slower to build and
        run): its runs also track every plain shared- and global-memory access in shadow memory
        and raise :class:`RaceError` at the first data race. Raises :class:`EmulatorError` if
        the pre-pass or the C++ compiler rejects the source.
        """
        pre = prepass(source)
        flags = RACECHECK_FLAGS if racecheck else KERNEL_FLAGS
        key = build_key(
            "k", str(ABI_VERSION), self._cxx_id, " ".join(flags), self._header, pre.source
        )
        with self._lock:
            mod = self._modules.get(key)
            if mod is not None:
                return mod

            def build(out: Path) -> None:
                cpp = out.with_suffix(".cpp")
                write_atomic(cpp, pre.source.encode())
                include = ["-include", str(self._include(racecheck))]
                if racecheck:  # compile, then link without libtsan (pf_emu.h has the hooks)
                    obj = out.with_suffix(".o")
                    compile_cxx(self.cxx, RACECHECK_FLAGS, cpp, obj, include)
                    compile_cxx(self.cxx, ("-shared",), obj, out)
                    obj.unlink(missing_ok=True)
                else:
                    compile_cxx(self.cxx, KERNEL_FLAGS, cpp, out, include)

            out, from_cache = cached_build(self.cache_dir, f"k-{key}.so", build)
            module, text = self._server.load(out)
            shared = (pre.shared, pre.dynamic)
            mod = EmulatedModule(self, out, from_cache, module, text, racecheck, shared)
            self._modules[key] = mod
            return mod

    def close(self) -> None:
        """Stop the server process (it restarts, reloading its libraries, when next used)."""
        with self._server.lock:
            self._server.close()
