"""The ONNX Backend API (``onnx.backend.base.Backend``) on top of polyfuse.

``prepare(model, device)`` imports the model (:func:`polyfuse.onnx.load`), compiles it with
:func:`polyfuse.compile` and returns a :class:`PolyfuseRep` whose ``run(inputs)`` executes the
generated CUDA on the CPU emulator (device ``"CPU"`` or ``"emulate"``) or on a GPU through pycuda
(``"CUDA"`` or ``"cuda"``). ``run_node`` wraps the node in a one-node model and runs that.

The ONNX project's runner drives it::

    import onnx.backend.test
    from polyfuse.onnx.backend import PolyfuseBackend
    globals().update(onnx.backend.test.BackendTest(PolyfuseBackend, __name__).test_cases)

Inputs keep their dtype (float16, bfloat16, float32, float64, uint8, int8, int16, int32,
int64, bool; uint16 inputs are passed as int32, uint32 and uint64 as int64); outputs are converted
back to the dtypes the model declares.
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
from polyfuse.graph import dtypes
from polyfuse.onnx.importer import InputValueNeeded, OnnxModel, load

__all__ = ["PolyfuseBackend", "PolyfuseRep", "prepare", "run_model", "run_node", "supports_device"]

_DEVICES = {"CPU": "emulate", "EMULATE": "emulate", "CUDA": "cuda"}


def _device(device: str) -> str:
    kind = str(device).split(":")[0].upper()
    if kind not in _DEVICES:
        raise CallError(f"unknown device '{device}'; use 'CPU'/'emulate' or 'CUDA'/'cuda'")
    return _DEVICES[kind]


def _feed(a: Any, dtype: str) -> np.ndarray:
    """A graph input as the compiled graph takes it: an integer or boolean array in the te
    dtype that holds it (uint16 → int32, uint32 → int64, exact), an array for a float32 tensor
    (float32, or an 8/4-bit float) as float32; another floating array as given, so that a
    wrong dtype is the compiled graph's ``CallError`` naming the input."""
    arr = np.asarray(a)
    ints = dtypes.is_int(dtype) or dtype == "bool"
    if dtype == "float32" or (arr.dtype.kind in "iub" and ints):
        return np.asarray(arr, dtype=np.dtype(dtype), order="C")
    return np.asarray(arr, order="C")


class PolyfuseRep(BackendRep):
    """A compiled ONNX model: ``run(inputs)`` → outputs in graph-output order.

    When graph inputs feed attribute-like inputs (axes, shape, pads, ...), the model is
    *specialized* on their values at call time: one import and compile per distinct value,
    cached in ``variants``; the plan of each variant says which inputs it was specialized on.
    """

    def __init__(
        self,
        model: OnnxModel | None,
        fn: CompiledGraph | None,
        device: str,
        *,
        proto: onnx.ModelProto | None = None,
        shapes: dict[str, Any] | None = None,
        compile_kw: dict[str, Any] | None = None,
        specialized: Sequence[str] = (),
    ) -> None:
        self.model = model
        self.fn = fn
        self.device = device
        self._proto = proto
        self._shapes = shapes
        self._compile_kw = dict(compile_kw or {})
        #: graph inputs whose values the model is specialized on (empty: compiled once)
        self.specialized: list[str] = list(specialized)
        #: value key -> (imported model, compiled graph) per distinct specialized value
        self.variants: dict[tuple[Any, ...], tuple[OnnxModel, CompiledGraph | None]] = {}
        self.input_names: list[str] = (
            [
                i.name
                for i in proto.graph.input
                if i.name not in {t.name for t in proto.graph.initializer}
            ]
            if proto is not None
            else list(model.input_names if model else [])
        )

    def _named(self, inputs: Any) -> dict[str, np.ndarray]:
        names = self.input_names
        if isinstance(inputs, dict):
            missing = [n for n in names if n not in inputs]
            if missing:
                raise CallError(f"model '{self._name()}': missing inputs {missing}")
            return {n: np.asarray(inputs[n]) for n in names}
        arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        if len(arrays) != len(names):
            raise CallError(
                f"model '{self._name()}': expected {len(names)} inputs "
                f"({', '.join(names)}), got {len(arrays)}"
            )
        return {n: np.asarray(a) for n, a in zip(names, arrays, strict=True)}

    def _name(self) -> str:
        if self.model is not None:
            return self.model.name
        return self._proto.graph.name if self._proto is not None else "model"

    def _variant(self, named: dict[str, np.ndarray]) -> tuple[OnnxModel, CompiledGraph | None]:
        """The model specialized on the values of ``self.specialized`` (imported once each)."""
        while True:
            vals = {n: named[n] for n in self.specialized}
            key = tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in vals.items())
            if key in self.variants:
                return self.variants[key]
            try:
                m = load(self._proto, shapes=self._shapes, values=vals)  # type: ignore[arg-type]
            except InputValueNeeded as e:
                if e.input_name in self.specialized:
                    raise
                self.specialized.append(e.input_name)
                continue
            fn = m.compile(**self._compile_kw) if m.outputs else None
            if fn is not None:
                desc = ", ".join(f"{n}={np.asarray(v).tolist()}" for n, v in vals.items())
                fn.plan.rewrites.append(
                    f"specialized on the values of graph inputs {desc} (they feed "
                    "attribute-like inputs; one compile per distinct value)"
                )
            self.variants[key] = (m, fn)
            return m, fn

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run on a list (graph-input order), a dict by input name, or a single array."""
        named = self._named(inputs)
        if self.specialized:
            m, fn = self._variant(named)
        else:
            m, fn = self.model, self.fn  # type: ignore[assignment]
        arrays = [_feed(named[n], t.dtype) for n, t in zip(m.input_names, m.inputs, strict=True)]
        res: tuple[np.ndarray, ...] = ()
        if fn is not None:
            out = fn(*arrays, device=self.device)
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
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model)
        try:
            m = load(proto, shapes=shapes)
        except InputValueNeeded as e:  # specialize on that input's value at call time
            return PolyfuseRep(
                None,
                None,
                dev,
                proto=proto,
                shapes=shapes,
                compile_kw=compile_kw,
                specialized=[e.input_name],
            )
        fn = m.compile(**compile_kw) if m.outputs else None
        return PolyfuseRep(m, fn, dev, proto=proto, shapes=shapes, compile_kw=compile_kw)

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
