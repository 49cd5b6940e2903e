"""CUDA layer: kernel AST, CUDA C printer, NVRTC/nvcc compile, CPU emulator and GPU runtime.

A subpackage of ``polyfuse`` (never a top-level ``cuda``), so NVIDIA's top-level ``cuda``
package (cuda-bindings) keeps its name; nothing here edits ``__path__``.
"""
