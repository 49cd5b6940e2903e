"""The polyfuse version and code-generation revision (one place; the compile cache salts its
keys with both, and saved artifacts record them)."""

__version__ = "0.1.0"

# Bumped whenever the code generated for a cached schedule changes meaning (2: NaN-propagating
# max/min, lane combines decided by isl; 3: GEMM-like micrographs tiled for registers and
# shared memory; 4: 128-bit vector copies into the shared tiles; 5: vector epilogue stores;
# 6: double-buffered shared tiles with cp.async on sm_80+; 7: GEMM loop code — unrolled
# reduction steps and copy loops, peeled pipeline, strength-reduced addresses, launch bounds,
# select-free updates, merged/aligned tile views; 8: GEMM tiles ranked on the loop code they
# get, under the loop-quality floor; 9: shared tiles pipelined over the S = 2..4 stages the stage
# model chooses; 10: tensor-core operand tiles XOR-swizzled instead of padded, a tensorized GEMM
# cached with 2 stages may now take 3; 11: 16-bit reductions kept on chip rounded to their dtype,
# one shared tile per access of a GEMM operand; 12: native 16-bit pair arithmetic, one typed
# lane-combine prelude, tensor-core tiles and conv fill orders from their models, gathered fills
# by cp.async; 13: a reduction isl skews keeps its original loop order or is split; 14: split
# partials read the identity in the body's dtype, a product reduction in the prelude; 15: uint8,
# int8 and int16 stored in their width, shifts through one unsigned-type template; 16: int8/uint8
# GEMMs on m16n8k32 tensor cores; 17: rows and columns swapped where that pads less, a column
# fold wherever B is gathered or chunkable; 18: a reshape's k // D, k % D operand priced per
# period, so its GEMM takes a real tile; outer reduction dims tiled by 1 where whole they fit
# no tile; tensor-core chunks of 16 bytes of the dtype; one array as both tensor-core
# operands; 19: tensor-core fills test no row of a tile the grid covers exactly; 20: launch
# bounds ask no more blocks per SM than the grid gives; 21: a tensorized GEMM's epilogue may
# store a whole-row tile to shared memory, after a barrier; the reduction reads a row tile it
# does not write as float4 runs; 22: a tensor-core kernel's IR work estimate holds its tail,
# the work outside its k-step loops; 16-bit float arithmetic is priced as floating point, not
# integer work; a tensor-core epilogue stores two adjacent columns per access where proven; a
# vector group's lanes that only its word store reads are rounded once, by that store; 23:
# launch bounds' register caps per SM partition, as ptxas caps them; 24: a tensor-core kernel
# whose k-steps are all unrolled is all tail; 25: the epilogue stores column pairs to a
# shared row tile as float2, its rows padded for them; 26: the epilogue tests only the
# extents its block tiles do not cover exactly; 27: tensor-core tiles priced by the cost
# model, the fewest others per HMMA within 5 % of its best; __launch_bounds__(threads, 1) on
# tiles of few registers; 28: an input several stitched parts read is staged in a shared tile
# where its re-read would miss the L1; 29: a kernel's re-read bytes for the cost model; 30:
# matrix-vector products on reduction lanes, float32 reduction axes split where no k-tile
# keeps to their runs, the loop-quality floor's slack, GEMM epilogues split off where they
# read other elements; 31: GEMM tile estimates count each access group of an operand read
# twice (q @ k^T of a merged qkv) and price 16-byte cp.async fills as bypassing the L1; the
# IR estimate counts select-free updates as lowered; a 1x1 micro-tile's register fragments
# load before their statement; short x-reduces filling the GPU run serially per thread; 32:
# tensor-core scalar fills in the blocked order; 33: a pipelined tensor-core kernel's steady
# state unrolled by its stages where the registers allow; 34: row-guarded tensor-core chunks
# address a clamped row in the steady state; 35: gathered chunk fills carry their reduction
# digits across k-tiles, and a pipelined loop's drain fills nothing; 36: their channel offset
# from k0, only the outer digits carried; 37: a gathered fill without padding tests clamps
# rows past the end in its setup, its steady addresses unselected), so kernels and schedules
# cached by an older compiler miss.
CODEGEN_REVISION = 37
