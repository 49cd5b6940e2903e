"""The CUDA toolchain: finding NVRTC/nvcc, compiling kernels to PTX/cubin, and the SASS
instrument (disassembly and loop analysis)."""
