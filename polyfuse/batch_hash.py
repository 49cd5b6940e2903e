"""The model cache key of ``polyfuse zoo``: a structural hash of a whole graph and a digest
of the compiler's own source files (a changed compiler misses the cache)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- hashing


@functools.cache
def compiler_digest() -> str:
    """Digest of the compiler's source files: a changed compiler misses the model cache."""
    import polyfuse

    h = hashlib.sha256(polyfuse.__version__.encode())
    here = Path(polyfuse.__file__).parent
    for p in sorted(here.rglob("*")):
        rel = p.relative_to(here)
        if not p.is_file() or "__pycache__" in rel.parts or p.name.startswith("batch"):
            continue
        if p.suffix == ".py" or rel.parts[:3] == ("cuda", "emulator", "rt"):
            h.update(str(rel).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def graph_hash(inputs: Sequence[Any], outputs: Sequence[Any], constants: Sequence[Any]) -> str:
    """A structural hash of a te graph.

    Tensors are numbered in first-visit order and loop variables by their first appearance
    in each compute, so two separately built copies of the same model hash equal; placeholder
    names, shapes, dtypes, tags, constants and the input/output order are part of the hash;
    compute names (often generated, ``add17``) and weight values are not. Expression nodes
    are hashed generically from their dataclass fields.
    """
    from polyfuse.graph.expr import IterVar, Tensor

    h = hashlib.sha256()
    tensor_ids: dict[int, int] = {}
    order: list[Tensor] = []
    const_ids = {id(t) for t in constants}

    def visit(root: Tensor) -> None:
        stack: list[tuple[Tensor, bool]] = [(root, False)]
        while stack:
            t, done = stack.pop()
            if id(t) in tensor_ids:
                continue
            if done or t.op is None:
                tensor_ids[id(t)] = len(order)
                order.append(t)
                continue
            stack.append((t, True))
            stack.extend((s, False) for s in reversed(t.op.inputs()))

    for t in [*inputs, *constants, *outputs]:
        visit(t)

    def enc(v: Any, vars_: dict[int, int]) -> str:
        if isinstance(v, Tensor):
            return f"T{tensor_ids.get(id(v), -1)}"
        if isinstance(v, IterVar):
            n = vars_.setdefault(id(v), len(vars_))
            return f"V{n}:{v.kind}:{v.lo}:{v.hi}"
        if dataclasses.is_dataclass(v):
            parts = [
                enc(getattr(v, f.name), vars_) for f in dataclasses.fields(v) if f.name != "uid"
            ]
            return f"{type(v).__name__}(" + ",".join(parts) + ")"
        if isinstance(v, list | tuple):
            return "[" + ",".join(enc(x, vars_) for x in v) + "]"
        return repr(v)

    for t in order:
        kind = "C" if id(t) in const_ids else "P" if t.op is None else "F"
        # computes are numbered, not named: ops' generated names (``add17``) depend on what
        # was built before in the process; placeholder names are the call interface
        head = f"{kind}|{t.name if t.op is None else ''}|{t.shape}|{t.dtype}|"
        body = ""
        if t.op is not None:
            vars_: dict[int, int] = {}
            axes = ",".join(enc(a, vars_) for a in t.op.axes)
            body = f"{t.op.tag}|{axes}|{enc(t.op.body, vars_)}"
        h.update((head + body + "\n").encode())
    boundary = [tensor_ids[id(t)] for t in inputs], [tensor_ids[id(t)] for t in outputs]
    h.update(repr(boundary).encode())
    return h.hexdigest()
