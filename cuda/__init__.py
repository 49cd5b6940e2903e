"""CUDA layer: kernel AST, CUDA C printer, NVRTC/nvcc compile, CPU emulator and GPU runtime."""

# This folder is installed as ``polyfuse.cuda``; but when a source checkout's root is on
# sys.path (``python -m pytest`` from the root) it also shadows NVIDIA's namespace package
# ``cuda`` (cuda-bindings: ``cuda.bindings.driver``), because a regular package wins over
# namespace portions. Extending the search path lets ``cuda.bindings`` resolve either way.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)  # noqa: F821
