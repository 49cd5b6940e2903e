"""CUDA layer: kernel AST, CUDA C printer, NVRTC/nvcc compile, CPU emulator and pycuda runtime."""
