"""The ONNX Backend API (``onnx.backend.base.Backend``) on top of polyfuse.

``prepare(model, device)`` imports the model (:func:`polyfuse.onnx.load`), compiles it with
:func:`polyfuse.compile` and returns a :class:`PolyfuseRep` whose ``run(inputs)`` executes the
generated CUDA on the CPU emulator (device ``"CPU"`` or ``"emulate"``) or on a GPU through pycuda
(``"CUDA"`` or ``"cuda"``). ``run_node`` wraps the node in a one-node model and runs that.

The ONNX project's runner drives it::

    import onnx.backend.test
    from polyfuse.onnx.backend import PolyfuseBackend
    globals().update(onnx.backend.test.BackendTest(PolyfuseBackend, __name__).test_cases)

Inputs are converted to float32 (polyfuse compiles float32 graphs; integer and boolean inputs
are represented exactly as floats up to 2**24); outputs are converted back to the dtypes the
model declares.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from polyfuse.compiled import CompiledGraph
from polyfuse.errors import CallError, DeviceError
from polyfuse.onnx.importer import OnnxModel, load

__all__ = ["PolyfuseBackend", "PolyfuseRep", "prepare", "run_model", "run_node", "supports_device"]

_DEVICES = {"CPU": "emulate", "EMULATE": "emulate", "CUDA": "cuda"}


def _device(device: str) -> str:
    kind = str(device).split(":")[0].upper()
    if kind not in _DEVICES:
        raise CallError(f"unknown device '{device}'; use 'CPU'/'emulate' or 'CUDA'/'cuda'")
    return _DEVICES[kind]


class PolyfuseRep(BackendRep):
    """A compiled ONNX model: ``run(inputs)`` → outputs in graph-output order."""

    def __init__(self, model: OnnxModel, fn: CompiledGraph | None, device: str) -> None:
        self.model = model
        self.fn = fn
        self.device = device

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run on a list (graph-input order), a dict by input name, or a single array."""
        m = self.model
        if isinstance(inputs, dict):
            missing = [n for n in m.input_names if n not in inputs]
            if missing:
                raise CallError(f"model '{m.name}': missing inputs {missing}")
            arrays = [inputs[n] for n in m.input_names]
        elif isinstance(inputs, np.ndarray):
            arrays = [inputs]
        else:
            arrays = list(inputs)
            # initializers that are also graph inputs may be passed too; keep the real inputs
            if len(arrays) != len(m.input_names):
                raise CallError(
                    f"model '{m.name}': expected {len(m.input_names)} inputs "
                    f"({', '.join(m.input_names)}), got {len(arrays)}"
                )
        arrays = [np.ascontiguousarray(np.asarray(a), dtype=np.float32) for a in arrays]
        res: tuple[np.ndarray, ...] = ()
        if self.fn is not None:
            out = self.fn(*arrays, device=self.device)
            res = out if isinstance(out, tuple) else (out,)
        it = iter(res)
        values = []
        for name, dt in zip(m.output_names, m.output_dtypes, strict=True):
            v = m.constant_outputs[name] if name in m.constant_outputs else next(it)
            values.append(np.asarray(v).astype(dt, copy=False))
        return namedtupledict("Outputs", m.output_names)(*values)


class PolyfuseBackend(Backend):
    """polyfuse as an ONNX backend (devices: ``CPU`` = the CUDA emulator, ``CUDA`` = pycuda)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Always True: unsupported models raise a clear error from :meth:`prepare`."""
        return True

    @classmethod
    def prepare(
        cls, model: onnx.ModelProto | str, device: str = "CPU", **kwargs: Any
    ) -> PolyfuseRep:
        """Import and compile ``model``; ``shapes=`` and compile options pass through."""
        dev = _device(device)
        if dev == "cuda" and not cls.supports_device("CUDA"):
            raise DeviceError("device 'CUDA': no CUDA GPU/pycuda available; use device='CPU'")
        shapes = kwargs.pop("shapes", None)
        compile_kw = {
            k: v
            for k, v in kwargs.items()
            if k in ("arch", "budget", "mapping", "check_cuda", "stitch", "pack", "name")
        }
        compile_kw.setdefault("check_cuda", False)
        m = load(model, shapes=shapes)
        fn = m.compile(**compile_kw) if m.outputs else None
        return PolyfuseRep(m, fn, dev)

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[Any, ...]:
        """``prepare(model, device).run(inputs)``."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node: it is wrapped in a one-node model whose inputs are ``inputs``."""
        arrays = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
        names = [n for n in node.input if n]
        if len(names) != len(arrays):
            raise CallError(
                f"run_node {node.op_type}: {len(arrays)} inputs for {len(names)} node inputs"
            )
        vis = [
            helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), np.asarray(a).shape
            )
            for n, a in zip(names, arrays, strict=True)
        ]
        outs = []
        for i, o in enumerate(node.output):
            if not o:
                continue
            dt = (
                helper.np_dtype_to_tensor_dtype(np.dtype(outputs_info[i][0]))
                if outputs_info
                else onnx.TensorProto.FLOAT
            )
            outs.append(helper.make_tensor_value_info(o, dt, None))
        graph = helper.make_graph([node], f"node_{node.op_type}", vis, outs)
        opset = int(kwargs.pop("opset_version", onnx.defs.onnx_opset_version()))
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return cls.prepare(model, device, **kwargs).run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """``CPU`` (the emulator) always; ``CUDA`` when pycuda and a GPU driver are present."""
        try:
            dev = _device(device)
        except CallError:
            return False
        if dev == "emulate":
            return True
        try:
            import pycuda.driver as drv  # type: ignore[import-not-found]

            drv.init()
            return drv.Device.count() > 0
        except Exception:  # noqa: BLE001
            return False


prepare = PolyfuseBackend.prepare
run_model = PolyfuseBackend.run_model
run_node = PolyfuseBackend.run_node
supports_device = PolyfuseBackend.supports_device
