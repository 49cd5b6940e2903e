"""``torch.compile(model, backend="polyfuse")``: FX graphs → polyfuse regions + PyTorch rest.

Pipeline, as other out-of-tree backends (TVM, Hidet, ONNX Runtime) do it:

1. :func:`polyfuse_backend` receives Dynamo's FX graph and hands it to AOT autograd with the
   core-ATen decomposition table, so the graph it compiles uses core ATen operators only;
2. :func:`compile_fx` partitions that graph with PyTorch's capability-based partitioner:
   maximal regions (never creating a cycle) of nodes :func:`~.lower.unsupported_reason`
   accepts; every other operator stays in PyTorch — a graph break inside the returned
   callable, listed once with counts at debug level on the ``polyfuse.torch`` logger;
3. each region becomes a :class:`PolyfuseRegion`: its FX nodes lowered to polyfuse ops
   (:mod:`.lower`) and compiled by :func:`polyfuse.compile`, once, at the example shapes.

A region runs on the GPU through :mod:`polyfuse.cuda.runtime` when its inputs are CUDA
tensors (outputs are torch tensors on the same device, no copies), and on the CPU emulator
when they are CPU tensors (slow: for testing). CUDA tensors without a usable GPU runtime are
refused with a :class:`~polyfuse.errors.DeviceError` saying why. Inference only: under
autograd (inputs that require grad while grad is enabled) the model runs eagerly, with a
warning.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

import polyfuse
from polyfuse.cuda.runtime.program import VECTOR_ALIGN
from polyfuse.errors import DeviceError

from .lower import lower_graph, op_name, unsupported_reason

__all__ = ["PolyfuseRegion", "compile_fx", "polyfuse_backend"]

log = logging.getLogger("polyfuse.torch")

#: Operators that move no data by themselves: a region of only these stays in PyTorch.
_VIEW_OPS = {
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.reshape.default",
    "aten.permute.default",
    "aten.t.default",
    "aten.transpose.int",
    "aten.expand.default",
    "aten.unsqueeze.default",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.squeeze.default",
    "aten.clone.default",
    "aten.alias.default",
    "aten.detach.default",
    "aten._to_copy.default",
    "aten.slice.Tensor",
    "aten.split_with_sizes.default",
    "aten.split.Tensor",
    "getitem",
}


class _Support(OperatorSupportBase):
    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and unsupported_reason(node) is None


class PolyfuseRegion(torch.nn.Module):
    """A supported region of the FX graph, compiled by polyfuse.

    ``compiled`` is the :class:`~polyfuse.CompiledGraph`; ``ops`` the ATen operators it
    covers. Called with the region's input tensors, returns what the FX region returned.
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        name: str,
        arch: str,
        cache: Any = None,
        input_shapes: Sequence[Any] = (),
    ):
        super().__init__()
        lowered = lower_graph(gm, input_shapes)
        self.lowered = lowered
        self.region_name = name
        self.ops = Counter(op_name(n) for n in gm.graph.nodes if n.op == "call_function")
        kwargs = {"cache": cache} if cache is not None else {}
        self.compiled = polyfuse.compile(
            lowered.inputs, lowered.outputs, arch=arch, check_cuda=False, **kwargs
        )

    def __repr__(self) -> str:
        return (
            f"PolyfuseRegion({self.region_name}: {sum(self.ops.values())} ops, "
            f"{len(self.compiled.kernels)} kernels)"
        )

    def forward(self, *args: torch.Tensor) -> Any:
        tensors = [region_input(a) for a in args]
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise DeviceError(
                f"polyfuse region {self.region_name}: inputs on several devices ({devices})"
            )
        device = next(iter(devices)) if devices else torch.device("cpu")
        if device.type == "cuda":
            outs = self._run_cuda(tensors, device)
        elif device.type == "cpu":
            arrays = [t.detach().numpy() for t in tensors]
            res = self.compiled(*arrays, device="emulate")
            res = res if isinstance(res, tuple) else (res,)
            outs = [torch.from_numpy(np.ascontiguousarray(r)) for r in res]
        else:
            raise DeviceError(
                f"polyfuse region {self.region_name}: tensors on {device}; polyfuse runs on "
                "CUDA devices (and on the CPU emulator for CPU tensors)"
            )
        flat = [tensors[s[1]] if isinstance(s, tuple) else outs[s] for s in self.lowered.structure]
        return flat[0] if self.lowered.single else tuple(flat)

    def _run_cuda(self, tensors: list[torch.Tensor], device: torch.device) -> list[Any]:
        from polyfuse.cuda.runtime import gpu_available

        if not gpu_available():
            from polyfuse.cuda.runtime import select_driver

            try:
                select_driver()
                reason = "no CUDA device found"
            except DeviceError as e:
                reason = str(e)
            raise DeviceError(
                f"polyfuse region {self.region_name}: CUDA tensors, but polyfuse cannot run "
                f"on this GPU ({reason}); install 'polyfuse[cuda-bindings]', or compile the "
                "model with CPU tensors to use the emulator"
            )
        index = device.index if device.index is not None else torch.cuda.current_device()
        res = self.compiled(*tensors, device=f"cuda:{index}")
        return list(res) if isinstance(res, tuple) else [res]


def region_input(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the compiled region takes it: detached, C-contiguous and 16-byte aligned.

    The runtime refuses misaligned device arrays (kernels may use 128-bit accesses); a view
    into the middle of a tensor (``x[1:]``) is misaligned, so it is copied here instead of
    failing inside torch.compile.
    """
    t = t.detach().contiguous()
    return t.clone() if t.data_ptr() % VECTOR_ALIGN else t


def _partitions(gm: torch.fx.GraphModule) -> list[Any]:
    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    keep = []
    for p in partitioner.propose_partitions():
        compute = [n for n in p.nodes if op_name(n) not in _VIEW_OPS]
        if compute:
            keep.append(p)
    return partitioner, keep


def _report(gm: torch.fx.GraphModule, regions: Sequence[PolyfuseRegion]) -> dict[str, Any]:
    """What polyfuse took and what stayed in PyTorch (operator → count)."""
    covered: Counter[str] = Counter()
    for r in regions:
        covered.update(r.ops)
    eager: Counter[str] = Counter()
    reasons: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and not str(node.target).startswith("fused_"):
            name = op_name(node)
            if name == "getitem":
                continue
            eager[name] += 1
            reasons.setdefault(name, unsupported_reason(node) or "outside every region")
    return {"polyfuse": dict(covered), "eager": dict(eager), "reasons": reasons}


def compile_fx(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any] = (),
    *,
    arch: str = "sm_90",
    cache: Any = None,
) -> torch.fx.GraphModule:
    """Replace every supported region of a core-ATen FX graph by a :class:`PolyfuseRegion`.

    Returns the rewritten GraphModule (unsupported operators run in PyTorch between the
    regions); its ``polyfuse_report`` attribute lists the operators on each side.
    """
    partitioner, parts = _partitions(gm)
    fused = partitioner.fuse_partitions(parts, prefix="polyfuse_") if parts else gm
    regions = []
    for node in list(fused.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("polyfuse_"):
            sub = fused.get_submodule(node.target)
            shapes = [tuple(a.meta["val"].shape) for a in node.args]
            region = PolyfuseRegion(sub, str(node.target), arch, cache, shapes)
            setattr(fused, node.target, region)
            regions.append(region)
    fused.recompile()
    report = _report(fused, regions)
    fused.polyfuse_report = report
    fused.polyfuse_regions = regions
    if report["eager"]:
        listed = ", ".join(
            f"{name} x{n} ({report['reasons'][name]})"
            for name, n in sorted(report["eager"].items())
        )
        log.debug(
            "polyfuse: %d operators stay in PyTorch: %s", sum(report["eager"].values()), listed
        )
    log.debug(
        "polyfuse: %d regions, %d operators, %d kernels",
        len(regions),
        sum(sum(r.ops.values()) for r in regions),
        sum(len(r.compiled.kernels) for r in regions),
    )
    _LAST.clear()
    _LAST.append(fused)
    return fused


#: The GraphModule of the most recent compile (for inspection: ``last_compiled()``).
_LAST: list[torch.fx.GraphModule] = []


def last_compiled() -> torch.fx.GraphModule | None:
    """The rewritten FX graph of the most recent compile (``.polyfuse_report``, regions)."""
    return _LAST[-1] if _LAST else None


def polyfuse_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any):
    """The ``torch.compile`` backend (registered as ``"polyfuse"``).

    ``options`` (``torch.compile(..., options={...})``): ``arch`` — the CUDA architecture to
    compile for (default: the GPU's own when the inputs are CUDA tensors, else sm_90);
    ``cache`` — a :class:`polyfuse.cache.CompileCache`.
    """
    from functorch.compile import make_boxed_func
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    if torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
    ):
        warnings.warn(
            "polyfuse backend: inference only; this graph needs autograd and runs eagerly "
            "(call the model under torch.no_grad() or torch.inference_mode())",
            stacklevel=2,
        )
        return gm.forward
    arch = options.get("arch")
    if arch is None:
        cuda = [t for t in example_inputs if isinstance(t, torch.Tensor) and t.is_cuda]
        if cuda:
            major, minor = torch.cuda.get_device_capability(cuda[0].device)
            arch = f"sm_{major}{minor}"
        else:
            arch = "sm_90"

    def fw_compiler(fx: torch.fx.GraphModule, inputs: Sequence[Any]):
        return make_boxed_func(
            compile_fx(fx, inputs, arch=arch, cache=options.get("cache")).forward
        )

    backend = aot_autograd(fw_compiler=fw_compiler, decompositions=core_aten_decompositions())
    return backend(gm, example_inputs)
