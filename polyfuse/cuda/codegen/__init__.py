"""Code generation: the kernel IR, its lowering passes, packing, dedup and the CUDA
printer (mapped micrograph → kernel IR → CUDA C)."""
