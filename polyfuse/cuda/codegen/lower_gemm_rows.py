"""One ``__global__`` running a GEMM and the row reduction after it (Layer 2 for GEMMs).

The decision is :mod:`polyfuse.stitch.gemm_rows`'s.

Both halves are lowered and printed by their own passes (:func:`lower_gemm_kernel`,
:func:`lower_kernel`) with the intermediate placed in shared memory in both; this module only
joins the two printed bodies: each in its own C scope (their loop variables, block and thread
coordinates stay apart) and a barrier between them (the GEMM's epilogue stores the tile that
the reduction then reads). Both halves have the same grid and block size (checked by the
stitch), so every barrier is reached by the whole block.

Shared memory is one pool, overlaid by liveness: the GEMM's operand tiles from offset 0; the
row tile also from offset 0 in both halves, the reduction's own arrays after it. The operand
tiles are dead once the k-tile loop ends: the GEMM's schedule puts a barrier after every
k-tile's update (``SYNC_AFTER`` in :mod:`polyfuse.poly.promote`), before its epilogue stores
the row tile. The pool is the larger of the two halves' needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from polyfuse.cuda.codegen.kernel_ast import Kernel, KMark, KParam
from polyfuse.cuda.codegen.kernel_function import KFunction, print_function
from polyfuse.stitch.facts import KernelFacts, SharedArray

_HEAD = re.compile(
    r'extern "C" __global__ void (?:__launch_bounds__\((?P<bounds>[\d, ]+)\) )?(?P<name>\w+)\('
)
_PARAM = re.compile(r"(?P<decl>.*?)\s*__restrict__\s+(?P<name>\S+)$")


def _split(source: str) -> tuple[str, str, list[tuple[str, str]], str]:
    """(text before the kernel, launch bounds, [(declaration, name)] of the parameters, body
    between the kernel's braces) of one printed kernel."""
    m = _HEAD.search(source)
    assert m is not None, "a printed kernel"
    close = source.index(") {", m.end())
    params = []
    for p in filter(None, (x.strip() for x in source[m.end() : close].split(","))):
        pm = _PARAM.match(p)
        assert pm is not None, p
        params.append((pm.group("decl"), pm.group("name")))
    body = source[close + 3 :].rstrip()
    assert body.endswith("}")
    return source[: m.start()], m.group("bounds") or "", params, body[:-1]


_SHARED = re.compile(
    r"^(?P<pad>[ \t]*)__shared__ (?:__align__\((?P<align>\d+)\) )?"
    r"float (?P<name>[\w\x01\x02]+)\[(?P<n>\d+)\];$",  # canonical names are slots
    re.M,
)
POOL = "pf_pool"  # the joined kernel's shared memory
ALIGN = 16


def _pool(body: str, first: str, overlay: bool) -> tuple[str, int]:
    """``body`` with its static shared arrays as pointers into :data:`POOL` (16-byte
    aligned): ``first`` at offset 0, the others in declaration order after it or, with
    ``overlay``, from offset 0 too (their lifetimes end before ``first``'s begins); and the
    bytes they take."""
    arrays = [(m.group("name"), int(m.group("n"))) for m in _SHARED.finditer(body)]
    offsets, end, top = {}, 0, 0
    for name, n in sorted(arrays, key=lambda a: a[0] != first):  # stable: ``first`` leads
        size = -(-4 * n // ALIGN) * ALIGN
        if name == first and overlay:
            offsets[name] = 0
            top = size
            continue
        offsets[name] = end
        end += size
    end = max(end, top)

    def one(m: re.Match[str]) -> str:
        name, off = m.group("name"), offsets[m.group("name")]
        return f"{m.group('pad')}float* const {name} = reinterpret_cast<float*>({POOL} + {off});"

    return _SHARED.sub(one, body), end


@dataclass(frozen=True)
class RowBlocks:
    """Which reduction blocks one GEMM block runs: the GEMM's block grid (slowest first), the
    reduction's, and ``repeat`` reduction blocks per GEMM block along the last (rows)
    coordinate (:func:`polyfuse.stitch.gemm_rows.block_correspondence`, checked by isl)."""

    gemm_grid: tuple[int, ...]
    rows_grid: tuple[int, ...]
    repeat: int

    def loop(self, body: list[str]) -> list[str]:
        """``body`` (whose block index is ``pf_rb``) run for each reduction block of this
        GEMM block; the bounds are uniform per block, so its barriers stay convergent."""
        lines = ["int pf_g = blockIdx.x;"]
        gs = [f"pf_g{i}" for i in range(len(self.gemm_grid))]
        for i in reversed(range(len(gs))):
            if i == 0:
                lines.append(f"const int {gs[i]} = pf_g;")
            else:
                lines.append(
                    f"const int {gs[i]} = pf_g % {self.gemm_grid[i]}; pf_g /= {self.gemm_grid[i]};"
                )
        coords = gs[: len(self.rows_grid) - 1]
        last = f"{gs[-1]} * {self.repeat} + pf_j" if len(gs) == len(self.rows_grid) else "pf_j"
        coords.append("pf_r")
        lin, stride = [], 1
        for c, g in reversed(list(zip(coords, self.rows_grid, strict=True))):
            lin.append(f"{c} * {stride}" if stride != 1 else c)
            stride *= g
        lines += [
            f"for (int pf_j = 0; pf_j < {self.repeat}; ++pf_j) {{",
            f"  const int pf_r = {last};",
            f"  if (pf_r < {self.rows_grid[-1]}) {{  // uniform per block",
            f"    const int pf_rb = {' + '.join(reversed(lin))};",
            *("    " + x if x else x for x in body),
            "  }",
            "  __syncthreads();  // the next rows reuse the reduction's shared arrays",
            "}",
        ]
        return lines


def join_sources(
    name: str, gemm: str, rows: str, buffer: str, blocks: RowBlocks
) -> tuple[str, int]:
    """The source of kernel ``name`` running the printed kernels ``gemm`` then ``rows`` (for
    each of the GEMM block's reduction blocks, ``blocks``) on one shared pool in which both
    see the array ``buffer`` at offset 0; and the pool's bytes."""
    pre, bounds, gparams, gbody = _split(gemm)
    pre2, _, rparams, rbody = _split(rows)
    gbody, gbytes = _pool(gbody, buffer, overlay=True)
    rbody, rbytes = _pool(rbody, buffer, overlay=False)
    pool = max(gbytes, rbytes)
    seen = {n for _, n in gparams}
    params = gparams + [(d, n) for d, n in rparams if n not in seen]
    sig = ", ".join(f"{d} __restrict__ {n}" for d, n in params)
    head = f'extern "C" __global__ void __launch_bounds__({bounds}) {name}({sig}) {{'
    lines = [
        head,
        f"  __shared__ __align__({ALIGN}) unsigned char {POOL}[{pool}];",
        "  {  // the GEMM: its epilogue stores the row tile to shared memory",
        *("  " + x if x else x for x in gbody.strip("\n").split("\n")),
        "  }",
        "  __syncthreads();  // the row tile is complete before the reduction reads it",
        "  {  // the row reduction on the block's rows",
        *(
            "    " + x
            for x in blocks.loop(rbody.replace("blockIdx.x", "pf_rb").strip("\n").split("\n"))
        ),
        "  }",
        "}",
    ]
    return pre + pre2 + "\n".join(lines) + "\n", pool


def join_facts(gemm: KernelFacts, rows: KernelFacts, pool: int) -> KernelFacts:
    """The facts of the joined kernel: one static shared array (the pool)."""
    return replace(
        gemm,
        shared_arrays=(SharedArray(pool, ALIGN),),
        dynamic_shared_bytes=max(gemm.dynamic_shared_bytes, rows.dynamic_shared_bytes),
        barriers=True,
        shuffles=gemm.shuffles or rows.shuffles,
        axes=tuple(sorted({*gemm.axes, *rows.axes})),
    )


def join_functions(
    gemm: KFunction, rows: KFunction, buffer: str, blocks: RowBlocks
) -> tuple[KFunction, int]:
    """The printed function running ``gemm`` then ``rows`` (see :func:`join_sources`; real or
    canonical names alike) and the pool's bytes. Its body reads the launch indices itself."""
    text, pool = join_sources(
        "pf_joined",
        print_function(gemm, "pf_gemm"),
        print_function(rows, "pf_rows"),
        buffer,
        blocks,
    )
    head, _, rest = text.partition(" {\n")
    assert head.startswith('extern "C" __global__') and rest.endswith("}\n"), head
    seen = {n for _, n in gemm.params}
    params = gemm.params + tuple((c, n) for c, n in rows.params if n not in seen)
    fn = KFunction(params, gemm.threads, gemm.min_blocks, (), (), rest[: -len("}\n")], True, True)
    return fn, pool


def join_kernels(
    name: str, gemm: Kernel, rows: Kernel, buffer: str, cbuffer: str, blocks: RowBlocks
) -> Kernel:
    """One kernel running the lowered ``gemm`` and ``rows`` (same grid and block) on one
    shared pool, both halves seeing the array ``buffer`` (``cbuffer`` in canonical names) at
    its start; printed from the joined function, and its canonical twin joined the same way
    (what the compile cache keeps). Layer 3 does not pack it (it reads its block index)."""
    assert gemm.block == rows.block, (gemm.block, rows.block)
    assert gemm.facts is not None and rows.facts is not None
    assert not gemm.facts.dynamic_shared_bytes and not rows.facts.dynamic_shared_bytes
    assert gemm.printed is not None and rows.printed is not None
    printed, pool = join_functions(gemm.printed, rows.printed, buffer, blocks)
    canonical = None
    if gemm.canonical is not None and rows.canonical is not None:
        canonical, _ = join_functions(gemm.canonical, rows.canonical, cbuffer, blocks)
    seen = {p.name for p in gemm.params}
    params = list(gemm.params) + [
        KParam(p.name, p.ctype, p.tensor) for p in rows.params if p.name not in seen
    ]
    return Kernel(
        name,
        params,
        [KMark("rows:gemm", gemm.body), KMark("rows:reduce", rows.body)],
        gemm.grid,
        gemm.block,
        gemm.micrographs + rows.micrographs,
        facts=join_facts(gemm.facts, rows.facts, pool),
        source=print_function(printed, name),
        notes=gemm.notes + rows.notes,
        printed=printed,
        canonical=canonical,
    )
