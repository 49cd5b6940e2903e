"""Budget and placement policies: the memory thresholds every stage decides against, in one place.

Policy. A kernel's shared memory holds two things: the tiles placement moves into it (Layer 2
stitching, GEMM operand promotion) and, for a parallel reduction, the combine's scratch of one
float per thread. So

- a **reduction kernel's tiles** may take what the device lets one block opt in to
  (``smem_per_block_optin``) minus that scratch (:func:`reduction_tile_budget`);
- a **GEMM kernel's promoted tiles** must fit the default per-block limit
  (``smem_per_block``, no opt-in), so the tiled kernel launches on every device of its arch
  (:func:`gemm_tile_budget`);
- **static** ``__shared__`` arrays are used while the kernel's shared memory fits
  :data:`STATIC_SMEM_LIMIT` (so ptxas reports them); beyond it they are slices of one dynamic
  buffer and the launch opts in to the size;
- a **pack** of independent kernels (Layer 3) must fit both: its static arrays add up within
  :data:`STATIC_SMEM_LIMIT`, and static plus the largest dynamic part within the opt-in
  limit (:func:`pack_smem_refusal`).

The launch-shape thresholds stay with their models as declared config dataclasses:
:class:`polyfuse.poly.mapping.MappingConfig` (threads per block of plain kernels),
:class:`polyfuse.poly.cost.ReductionConfig` (lanes, serial elements per thread). The hardware
limits launches share (threads per block) and the register budget of GEMM micro-tiles are
declared here; occupancy has one formula, :func:`polyfuse.poly.device.occupancy` (the CUDA
occupancy calculator's arithmetic), which the cost model (:mod:`polyfuse.poly.costs`) uses
for every kernel, pack and GEMM tile candidate.
"""

from __future__ import annotations

from polyfuse.graph.dtypes import info as dtype_info
from polyfuse.graph.dtypes import register_dtype
from polyfuse.poly.device import DeviceSpec

FLOAT_BYTES = 4  # a float32 element; one word of the shared-memory pool
#: Dtypes whose tensors move one element per access, never in words: a 128-bit word holds 16
#: bools, a run longer than any lane group (fuzz seed 720130: a bool mask beside a float16
#: row). (The narrow integers move in words of their run's bytes: 4, 8 or 16.)
SCALAR_DTYPES = frozenset(("bool",))
STATIC_SMEM_LIMIT = 48 * 1024  # bytes of static __shared__ memory per block
COMBINE_SCRATCH_FLOATS_PER_THREAD = 1  # a reduction's cross-lane combine scratch
#: Threads per block no CUDA device exceeds (sm_70..sm_90): launches above it are refused.
MAX_THREADS_PER_BLOCK = 1024
#: Registers per thread assumed for occupancy before ptxas reported the kernel's own.
ASSUMED_REGISTERS = 32
#: Registers per thread a GEMM micro-tile may plan for (accumulators + operands + indices):
#: above it ptxas spills or occupancy drops, so such tilings are not ranked.
GEMM_REG_BUDGET = 168
#: Registers a GEMM thread needs besides its accumulators and operand fragments (estimate).
GEMM_REG_OVERHEAD = 40


def reduction_tile_budget(
    device: DeviceSpec, threads: int, scratch_bytes: int = FLOAT_BYTES
) -> int:
    """Bytes of shared memory a reduction kernel of ``threads`` threads may give to tiles
    (``scratch_bytes``: of one scratch element, 8 where a double or int64 combines)."""
    return device.smem_per_block_optin - scratch_bytes * COMBINE_SCRATCH_FLOATS_PER_THREAD * threads


def gemm_tile_budget(device: DeviceSpec) -> int:
    """Bytes of shared memory a GEMM kernel's promoted operand tiles may take per block."""
    return device.smem_per_block


def tensor_core_tile_budget(device: DeviceSpec) -> int:
    """Bytes of shared memory a tensorized GEMM's stages may take per block: the opt-in
    dynamic maximum (its stages past :data:`STATIC_SMEM_LIMIT` live in the dynamic pool, the
    launch raising the function's limit), so the stage model can pick 3-4 stages of large
    tiles as ALCOP does instead of being capped at the static 48 KB."""
    return device.smem_per_block_optin


def gemm_tile_registers(tm: int, tn: int) -> int:
    """Registers per thread a GEMM micro-tile ``tm x tn`` is estimated to need."""
    return tm * tn + tm + tn + GEMM_REG_OVERHEAD


def smem_itemsize(dtype: str) -> int:
    """Bytes a shared-memory element of a ``dtype`` tensor takes: its register dtype's size
    (a 16-bit float is held widened to float32; a double takes 8, a bool 1)."""
    return dtype_info(register_dtype(dtype)).itemsize


def smem_words(elements: int, itemsize: int) -> int:
    """4-byte words of a shared tile of ``elements`` elements of ``itemsize`` bytes, rounded
    up to whole 8-byte pairs for 8-byte elements (so the next tile stays aligned for them)."""
    words = -(-elements * itemsize // FLOAT_BYTES)
    return words + (words % 2 if itemsize == 8 else 0)


def fits_static(tile_floats: int, threads: int, scratch_words: int = 1) -> bool:
    """Whether a kernel's tiles (4-byte words) plus its combine scratch (``scratch_words``
    per thread: 2 for a double one) fit static ``__shared__`` memory."""
    scratch = COMBINE_SCRATCH_FLOATS_PER_THREAD * scratch_words * threads
    return (tile_floats + scratch) * FLOAT_BYTES <= STATIC_SMEM_LIMIT


def pack_smem_refusal(static: int, dynamic: int, device: DeviceSpec) -> str | None:
    """Why packed parts with ``static`` bytes of static and ``dynamic`` bytes of the largest
    dynamic shared memory do not fit one block, or None when they do."""
    if static > STATIC_SMEM_LIMIT:
        limit = STATIC_SMEM_LIMIT // 1024
        return f"static shared memory of the parts ({static} B) does not fit {limit} KB"
    if static + dynamic > device.smem_per_block_optin:
        return (
            f"shared memory of the parts ({static + dynamic} B) does not fit one block of "
            f"{device.name}"
        )
    return None


#: floats of register arrays one GEMM thread may hold (accumulators + operand fragments): the
#: tile ranking's register budget less its per-thread overhead estimate
#: (:mod:`polyfuse.poly.tiling`, 168 - 40), so that ptxas keeps every array in registers
GEMM_REGISTER_ARRAY_FLOATS = 128


def fits_register_fragments(accumulators: int, fragment_floats: int) -> bool:
    """Whether a GEMM thread's operand fragments fit in registers beside its accumulators."""
    return accumulators + fragment_floats <= GEMM_REGISTER_ARRAY_FLOATS
