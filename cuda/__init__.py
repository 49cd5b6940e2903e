"""CUDA layer: kernel AST, CUDA C printer, NVRTC/nvcc compile, CPU emulator and GPU runtime.

Installed as ``polyfuse.cuda`` (pyproject's package-dir maps this folder), so NVIDIA's
top-level ``cuda`` package (cuda-bindings) keeps its name; nothing here edits ``__path__``.
"""
