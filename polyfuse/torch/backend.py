"""``torch.compile(model, backend="polyfuse")``: FX graphs → polyfuse regions + PyTorch rest.

Pipeline, as other out-of-tree backends (TVM, Hidet, ONNX Runtime) do it:

1. :func:`polyfuse_backend` reads and validates ``options=`` (:mod:`.options`) and receives
   Dynamo's FX graph. A graph with static shapes goes to AOT autograd with
   :func:`~.decomp.decomposition_table` (core ATen, plus decompositions of PyTorch's fused
   inference operators: ``_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``,
   ``scaled_dot_product_attention`` and its device kernels), so the graph it compiles uses
   operators polyfuse lowers. A graph with dynamic shapes (Dynamo's recompile after a second
   batch size) is compiled once per concrete input signature when it is called
   (:class:`~.specialize.Specializations`, LRU-bounded by ``max_specializations``): polyfuse
   kernels are specialised to their shapes.
2. :func:`compile_fx` partitions that graph with PyTorch's capability-based partitioner:
   maximal regions (never creating a cycle) of nodes :func:`~.lower.unsupported_reason`
   accepts; every other operator stays in PyTorch — a graph break inside the returned
   callable. After every compile, a WARNING on the ``polyfuse.torch`` logger says so when a
   graph got no region or under half of its FLOPs in regions, with the top reasons
   (:mod:`.coverage`); the full operator lists are at debug level.
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

import functools
import itertools
import logging
import warnings
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

import polyfuse
from polyfuse.cuda.runtime.program import VECTOR_ALIGN
from polyfuse.cuda.toolchain.compiler import SUPPORTED_ARCHS
from polyfuse.errors import DeviceError

from .coverage import DATA_MOVEMENT, Coverage, measure, warn_if_low
from .decomp import decomposition_table
from .lower import lower_graph, op_name, unsupported_reason
from .options import BackendOptions, parse_options
from .specialize import INFERENCE_ONLY, Specializations, is_symbolic, needs_autograd

__all__ = [
    "PolyfuseRegion",
    "compile_fx",
    "compile_static",
    "compiled_graphs",
    "last_compiled",
    "polyfuse_backend",
    "reset",
]

log = logging.getLogger("polyfuse.torch")


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
            arrays = [to_numpy(t) for t in tensors]
            res = self.compiled(*arrays, device="emulate")
            res = res if isinstance(res, tuple) else (res,)
            outs = [from_numpy(r) for r in res]
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


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array of its dtype, sharing memory (a bfloat16 tensor, which
    numpy lacks, as ``ml_dtypes.bfloat16`` through its bits)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """The inverse of :func:`to_numpy` (a C-contiguous copy where ``a`` is not; a 0-d array
    stays 0-d, which ``np.ascontiguousarray`` would make 1-d)."""
    a = a if a.flags.c_contiguous else a.copy(order="C")
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


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
        compute = [n for n in p.nodes if op_name(n) not in DATA_MOVEMENT]
        # a region reading no tensor (only constants: full, scalar_tensor) would have no
        # device to run on; such constants stay in PyTorch, where the model's device is known
        reads = any(a not in p.nodes for n in p.nodes for a in n.all_input_nodes)
        if compute and reads:
            keep.append(p)
    return partitioner, keep


def _report(
    gm: torch.fx.GraphModule, regions: Sequence[PolyfuseRegion], coverage: Coverage
) -> dict[str, Any]:
    """What polyfuse took and what stayed in PyTorch (operator → count, and why)."""
    covered: Counter[str] = Counter()
    for r in regions:
        covered.update(r.ops)
    eager: Counter[str] = Counter()
    reasons: dict[str, str] = {}
    for_dtype: Counter[str] = Counter()
    for node in gm.graph.nodes:
        if node.op == "call_function" and not str(node.target).startswith("fused_"):
            name = op_name(node)
            if name == "getitem":
                continue
            eager[name] += 1
            why = unsupported_reason(node)
            reasons.setdefault(name, why or "outside every region")
            if why is not None and why.startswith("dtype "):
                for_dtype[f"{name} ({why})"] += 1
    return {
        "polyfuse": dict(covered),
        "eager": dict(eager),
        "reasons": reasons,
        "coverage": coverage,
        "eager_for_dtype": dict(for_dtype),
    }


#: The GraphModules of the most recent compiles, oldest first (``compiled_graphs()``).
_HISTORY: deque[torch.fx.GraphModule] = deque(maxlen=32)
_COUNTER = itertools.count(1)


def compile_fx(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any] = (),
    *,
    arch: str = "sm_90",
    cache: Any = None,
    label: str | None = None,
) -> torch.fx.GraphModule:
    """Replace every supported region of a core-ATen FX graph by a :class:`PolyfuseRegion`.

    Returns the rewritten GraphModule (unsupported operators run in PyTorch between the
    regions); its ``polyfuse_report`` attribute lists the operators on each side and the
    :class:`~.coverage.Coverage` (``eager_for_dtype``: "op (reason)" → nodes left in PyTorch
    for their dtype), ``polyfuse_regions`` the regions. Logs a WARNING naming every operator
    left in PyTorch for its dtype, and the coverage WARNING when polyfuse took too little
    (:func:`~.coverage.warn_if_low`).
    """
    label = label or f"#{next(_COUNTER)}"
    partitioner, parts = _partitions(gm)
    covered = {n.name for p in parts for n in p.nodes}
    coverage = measure(gm, covered, len(parts))
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
    report = _report(fused, regions, coverage)
    fused.polyfuse_report = report
    fused.polyfuse_regions = regions
    fused.polyfuse_label = label
    fused.polyfuse_arch = arch
    if report["eager"]:
        listed = ", ".join(
            f"{name} x{n} ({report['reasons'][name]})"
            for name, n in sorted(report["eager"].items())
        )
        log.debug(
            "polyfuse: graph %s: %d operators stay in PyTorch: %s",
            label,
            sum(report["eager"].values()),
            listed,
        )
    log.debug(
        "polyfuse: graph %s: %d regions, %d operators, %d kernels for %s, %.0f%% of FLOPs",
        label,
        len(regions),
        sum(sum(r.ops.values()) for r in regions),
        sum(len(r.compiled.kernels) for r in regions),
        arch,
        100 * coverage.share,
    )
    if report["eager_for_dtype"]:  # a dtype fallback is never silent
        log.warning(
            "polyfuse: graph %s: %d operators stay in PyTorch for their dtype: %s",
            label,
            sum(report["eager_for_dtype"].values()),
            ", ".join(f"{k} x{n}" for k, n in sorted(report["eager_for_dtype"].items())),
        )
    warn_if_low(coverage, label)
    _HISTORY.append(fused)
    return fused


def last_compiled() -> torch.fx.GraphModule | None:
    """The rewritten FX graph of the most recent compile (``.polyfuse_report``, regions)."""
    return _HISTORY[-1] if _HISTORY else None


def compiled_graphs() -> list[torch.fx.GraphModule]:
    """The rewritten FX graphs of the most recent compiles (at most 32), oldest first: one
    per Dynamo graph with static shapes, one per specialization of a dynamic one."""
    return list(_HISTORY)


def reset() -> None:
    """Forget :func:`compiled_graphs` (compiled models keep working)."""
    _HISTORY.clear()


def resolve_arch(arch: str | None, example_inputs: Sequence[Any]) -> str:
    """``arch`` if given; else the GPU's own for CUDA inputs (the newest supported arch not
    above it), else sm_90."""
    if arch is not None:
        return arch
    cuda = [t for t in example_inputs if isinstance(t, torch.Tensor) and t.is_cuda]
    if not cuda:
        return "sm_90"
    major, minor = torch.cuda.get_device_capability(cuda[0].device)
    own = major * 10 + minor
    fits = [a for a in SUPPORTED_ARCHS if int(a.removeprefix("sm_")) <= own]
    return fits[-1] if fits else SUPPORTED_ARCHS[0]


@functools.lru_cache(maxsize=1)
def _decompositions() -> dict[Any, Any]:
    return decomposition_table()


def compile_static(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    opts: BackendOptions,
    label: str | None = None,
) -> Callable[..., Any]:
    """Dynamo graph with static shapes → AOT autograd (our decompositions) → :func:`compile_fx`."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    arch = resolve_arch(opts.arch, example_inputs)

    def fw_compiler(fx: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
        fused = compile_fx(fx, inputs, arch=arch, cache=opts.cache, label=label)
        return make_boxed_func(fused.forward)

    backend = aot_autograd(fw_compiler=fw_compiler, decompositions=_decompositions())
    return backend(gm, list(example_inputs))


def polyfuse_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    mode: str | None = None,
    **kwargs: Any,
) -> Callable[..., Any]:
    """The ``torch.compile`` backend (registered as ``"polyfuse"``).

    ``options`` (``torch.compile(..., options={...})``, or keywords): ``arch`` — the CUDA
    architecture to compile for (default: the GPU's own when the inputs are CUDA tensors,
    else sm_90); ``cache`` — a :class:`polyfuse.cache.CompileCache`;
    ``max_specializations`` — static compiles kept per graph with dynamic shapes (LRU,
    default 8). An unknown key or a bad value raises
    :class:`~.options.BackendOptionError` (Dynamo wraps it in ``BackendCompilerFailed``).
    """
    opts = parse_options(options, mode, **kwargs)
    if needs_autograd(example_inputs):
        warnings.warn(INFERENCE_ONLY, stacklevel=2)
        return gm.forward
    if is_symbolic(example_inputs):
        log.debug("polyfuse: dynamic shapes: one static compile per input signature")
        return Specializations(gm, opts, compile_static)
    return compile_static(gm, example_inputs, opts)
