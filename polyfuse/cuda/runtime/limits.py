"""The CUDA launch limits the runtime checks a launch against: its own constants, so that the
runtime imports nothing of the compiler. They are hardware facts of every GPU polyfuse
targets (sm_70 and later); the compiler plans within the same numbers
(:mod:`polyfuse.poly.policy`, which ``tests/test_runtime_leaf.py`` holds equal).
"""

from __future__ import annotations

#: bytes of shared memory a block may use without the opt-in function attribute (static
#: ``__shared__`` arrays at most; dynamic memory beyond it needs
#: ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``)
STATIC_SMEM_LIMIT = 48 * 1024

#: threads of one block
MAX_THREADS_PER_BLOCK = 1024
