"""How much of a compiled FX graph polyfuse took, and a warning when it is too little.

A torch.compile backend that quietly leaves a model in PyTorch looks like a working model
with no speed-up. After every compile, :func:`measure` counts each ATen node's FLOPs
(PyTorch's own formulas for matmul, convolution and attention; one per output element for
the rest) on both sides of the cut, and :func:`warn_if_low` logs one WARNING line on the
``polyfuse.torch`` logger when a graph with computation got no region, or less than
:data:`MIN_FLOP_SHARE` of its FLOPs in regions, naming the top reasons with their node counts
("op aten.cumsum.default not supported (3 nodes)", "dtype int16 (polyfuse stores ...) (12
nodes)").
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from .lower import op_name, unsupported_reason

__all__ = ["MIN_FLOP_SHARE", "Coverage", "measure", "node_flops", "warn_if_low"]

log = logging.getLogger("polyfuse.torch")

#: Below this share of a graph's FLOPs in polyfuse regions, the compile warns.
MIN_FLOP_SHARE = 0.5

#: How many reasons the warning names (the rest are at debug level with the full report).
TOP_REASONS = 3

#: Operators that compute nothing: a graph of only these has nothing for polyfuse to take.
DATA_MOVEMENT = frozenset(
    {
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
        "aten.lift_fresh_copy.default",
        "aten._to_copy.default",
        "aten.slice.Tensor",
        "aten.select.int",
        "aten.diagonal.default",
        "aten.split_with_sizes.default",
        "aten.split.Tensor",
        "getitem",
    }
)


def _val(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else a


def _numel(v: Any) -> int:
    if isinstance(v, torch.Tensor):
        return math.prod(int(s) for s in v.shape)
    if isinstance(v, (list, tuple)):
        return sum(_numel(x) for x in v)
    return 0


def node_flops(node: torch.fx.Node) -> int:
    """Floating-point operations of one call_function node, from its tensors' metadata.

    Matmuls, convolutions and attention use ``torch.utils.flop_counter``'s formulas (2·M·N·K);
    any other operator counts one per element of its largest input or output (an
    elementwise op, a reduction, a copy). Data-movement operators count zero.
    """
    if node.op != "call_function" or op_name(node) in DATA_MOVEMENT:
        return 0
    from torch.utils.flop_counter import flop_registry

    target = node.target
    packet = getattr(target, "overloadpacket", None)
    if packet in flop_registry:
        args = torch.fx.node.map_arg(node.args, _val)
        kwargs = torch.fx.node.map_arg(node.kwargs, _val)
        try:
            return int(flop_registry[packet](*args, out_val=_val(node), **kwargs))
        except Exception:  # a formula that does not take this overload: count elements
            pass
    sizes = [_numel(_val(a)) for a in node.all_input_nodes] + [_numel(_val(node))]
    return max(sizes, default=0)


@dataclass
class Coverage:
    """FLOPs of a graph and of the part in polyfuse regions; why the rest stayed in PyTorch.

    ``reasons`` maps each reason to (nodes, FLOPs) over the computing nodes left in PyTorch.
    """

    total_flops: int = 0
    covered_flops: int = 0
    compute_nodes: int = 0
    regions: int = 0
    reasons: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def share(self) -> float:
        """Fraction of the FLOPs in regions (1.0 for a graph that computes nothing)."""
        return self.covered_flops / self.total_flops if self.total_flops else 1.0

    def top_reasons(self, n: int = TOP_REASONS) -> list[str]:
        """``"<reason> (<k> nodes)"``, most FLOPs first (then most nodes)."""
        ranked = sorted(self.reasons.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
        return [f"{r} ({k} node{'s' if k != 1 else ''})" for r, (k, _) in ranked[:n]]


def measure(gm: torch.fx.GraphModule, covered: Collection[str], regions: int) -> Coverage:
    """The coverage of ``gm`` (before its regions are cut out) when the nodes named in
    ``covered`` run in ``regions`` polyfuse regions."""
    cov = Coverage(regions=regions)
    nodes: Counter[str] = Counter()
    flops: Counter[str] = Counter()
    for node in gm.graph.nodes:
        if node.op != "call_function" or op_name(node) in DATA_MOVEMENT:
            continue
        f = node_flops(node)
        cov.compute_nodes += 1
        cov.total_flops += f
        if node.name in covered:
            cov.covered_flops += f
            continue
        reason = unsupported_reason(node) or "outside every region (too small alone)"
        nodes[reason] += 1
        flops[reason] += f
    cov.reasons = {r: (nodes[r], flops[r]) for r in nodes}
    return cov


def _flops_text(f: int) -> str:
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if f >= scale:
            return f"{f / scale:.3g} {unit}"
    return f"{f} FLOP"


def warn_if_low(cov: Coverage, graph: str, logger: logging.Logger = log) -> str | None:
    """Log (and return) the one-line WARNING when ``graph`` computes something and got no
    region or under :data:`MIN_FLOP_SHARE` of its FLOPs in regions; else None."""
    if cov.compute_nodes == 0:
        return None
    if cov.regions and cov.share >= MIN_FLOP_SHARE:
        return None
    head = (
        "no polyfuse region"
        if not cov.regions
        else f"only {cov.share:.0%} of its FLOPs in {cov.regions} polyfuse region(s)"
    )
    why = "; ".join(cov.top_reasons()) or "no reason recorded"
    msg = (
        f"polyfuse: graph {graph} ({cov.compute_nodes} ops, {_flops_text(cov.total_flops)}) "
        f"has {head}; it runs in PyTorch because: {why}"
    )
    logger.warning(msg)
    return msg
