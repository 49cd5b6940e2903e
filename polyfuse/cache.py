"""The compile cache: schedules, stitch decisions and kernels by structural key.

Entries are keyed by :func:`polyfuse.graph.structure.structural_key` (the computation, shapes
and boundary of a group of primitives, salted with the target architecture, the compiler
version and the options), so identical layers — within one model or across models — are
scheduled and generated once. Names are stored in canonical form (``pfT0``, ``pfT1``…) and
mapped back to each use. With a directory the cache persists across processes (one
:class:`polyfuse.base.store.Store` entry per key: versioned, checksummed, written atomically);
without one it still deduplicates within a compile.

A kernel is stored as the printer wrote it with those names, apart from its name and launch
indices (:class:`polyfuse.cuda.codegen.kernel_function.KFunction`, printed through the namer,
:mod:`polyfuse.cuda.codegen.namer`), so none of its generated locals is stored under a user's name.

An entry that is unreadable, fails its checksum, comes from another version or lacks the
fields its use needs is a miss: the caller rebuilds it and the rewrite heals the file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from polyfuse.base.decision import Decided, DecisionKind, DecisionNote
from polyfuse.base.decision_data import RecomputeData, typed_data
from polyfuse.base.settings import cache_root
from polyfuse.base.store import Store
from polyfuse.cuda.codegen.kernel_ast import Kernel, KParam
from polyfuse.cuda.codegen.kernel_function import KFunction, instantiate_function, print_function
from polyfuse.cuda.codegen.namer import Namer, c_name, fill, slots
from polyfuse.graph.structure import StructuralKey, structural_key
from polyfuse.poly.placement import Placement
from polyfuse.stitch.facts import KernelFacts
from polyfuse.stitch.plan import KernelPlan

#: Bump when what an entry holds changes (older entries then read as misses).
ENTRY_VERSION = 12  # 3: placements and recomputes carry their decision kinds; 4: layout
# 5: the layout records include the reduction layout and GEMM tiles (REDUCTION_LAYOUT, GEMM_TILE)
# 6: kernel facts (polyfuse.stitch.facts) and the global read footprints Layer 3 intersects
# 7: kernel sources printed by the namer with canonical names (escaped C names, float4 streams)
# 8: the global bytes per tensor (Kernel.tensor_bytes)
# 9: kernel facts carry the IR work estimate the cost model reads (KernelFacts.work)
# 10: the kernel as a printed function apart from its launch indices (KFunction), not source,
#     its tensor names as the namer's slots (polyfuse.cuda.codegen.namer.fill)
# 11: layout records carry their typed data's family, subject and made (base/decision_data.py)
# 12: kernel notes that are decisions (base/decision.py DecisionNote) are stored as records
#: The fields of each kind of entry: a stored value must hold all fields of one of them.
SCHEDULE_FIELDS = (("schedule", "notes"), ("feedback", "reason"))
KERNEL_FIELDS = (
    (
        "function",
        "params",
        "grid",
        "block",
        "facts",
        "bytes_read",
        "bytes_written",
        "tensor_bytes",
        "notes",
        "placements",
        "recomputes",
        "layout",
        "shared_reads",
    ),
)

#: A tuned GEMM tiling (``polyfuse tune``): the winner and what it was measured against.
TUNE_FIELDS = (("tile", "device", "measured_us", "modelled_us", "modelled_best_us"),)


def tune_key(graph, prims: list[str], arch: str, revision: int) -> str:
    """The key of a micrograph's tuned tiling: its structure, the arch and the code revision
    (a kernel generated differently must be timed again)."""
    return structural_key(graph, prims, f"tune|codegen {revision}|{arch}").digest


# identifiers, but not members (blockIdx.x) or the tails of numbers (1e-05f)
_TOKEN = re.compile(r"(?<![\w.])[A-Za-z_][A-Za-z0-9_]*")
_PREFIXES = ("S_", "r_", "s_", "")
_SUFFIX = re.compile(r"^(.*?)((?:_init|_update|_final)?(?:_acc)?(?:_lo\d+)?)$")


def rename(text: str, mapping: dict[str, str]) -> str:
    """Rename tensor identifiers in generated text, including the names derived from them
    (``r_x``, ``s_x``, ``s_x_lo0``, ``x_acc``, statement names ``S_x_update``)."""
    parts, slots = _template(text)
    out = list(parts)
    get = mapping.get
    for i, cands in slots:
        for pre, base, suf in cands:
            new = get(base)
            if new is not None:
                out[i] = pre + new + suf
                break
    return "".join(out)


@lru_cache(maxsize=8192)
def _template(text: str) -> tuple[tuple[str, ...], tuple[tuple[int, tuple], ...]]:
    """``text`` split once into literal pieces and identifier slots; each slot lists its
    readings (prefix, base name, suffix) in the order :func:`rename` tries them. Identical
    layers rename the same cached text many times, so the tokenizing is done once."""
    parts: list[str] = []
    slots: list[tuple[int, tuple]] = []
    last = 0
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        cands = []
        for pre in _PREFIXES:
            if pre and not tok.startswith(pre):
                continue
            base, suf = _SUFFIX.match(tok[len(pre) :]).groups()  # type: ignore[union-attr]
            cands.append((pre, base, suf))
        parts.append(text[last : m.start()])
        slots.append((len(parts), tuple(cands)))
        parts.append(tok)
        last = m.end()
    parts.append(text[last:])
    return tuple(parts), tuple(slots)


def default_dir() -> Path | None:
    """``$POLYFUSE_CACHE/compile`` or ``~/.cache/polyfuse/compile``; None when disabled."""
    root = cache_root()
    return None if root is None else root / "compile"


class CompileCache:
    """Structural-key store for schedules, stitch decisions and kernels (see module doc)."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory) if directory else None
        self.store = Store(self.directory, "compile", ENTRY_VERSION) if self.directory else None
        self.memory: dict[str, Any] = {}
        self.hits = 0
        self.misses = 0

    @classmethod
    def default(cls) -> CompileCache:
        """A cache persisted under :func:`default_dir` (in memory only when disabled)."""
        return cls(default_dir())

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def get(self, key: str, fields: Sequence[Sequence[str]] | None = None) -> Any:
        """The entry for ``key`` or None (counted as a hit or a miss).

        With ``fields`` (alternatives, e.g. :data:`SCHEDULE_FIELDS`), an entry that is not a
        dict holding every field of one alternative is a miss too.
        """
        value = self.memory.get(key)
        if value is None and self.store is not None:
            value = self.store.read_json(f"{key}.json")
        if value is not None and fields is not None:
            ok = isinstance(value, dict) and any(all(f in value for f in alt) for alt in fields)
            value = value if ok else None
        if value is None:
            self.misses += 1
            return None
        self.memory[key] = value
        self.hits += 1
        return value

    def peek(self, key: str, fields: Sequence[Sequence[str]]) -> Any:
        """Like :meth:`get` but not counted as a hit or miss (optional lookups such as tuned
        tilings, which most compiles do not have)."""
        hits, misses = self.hits, self.misses
        value = self.get(key, fields)
        self.hits, self.misses = hits, misses
        return value

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON-serialisable) under ``key`` (atomically replacing the file)."""
        self.memory[key] = value
        if self.store is not None:
            self.store.write_json(f"{key}.json", value)

    def __repr__(self) -> str:
        where = self.directory or "memory"
        return f"<CompileCache {where}: {self.hits} hits, {self.misses} misses>"


def kernel_entry(kernel: Kernel, kp: KernelPlan, key: StructuralKey) -> dict[str, Any]:
    """What the cache keeps of a generated kernel, in canonical names (its function as printed
    with the key's canonical names: ``kernel.canonical``)."""
    canon = dict(key.canonical())
    if kernel.canonical is None:
        raise ValueError(f"kernel {kernel.name} was not printed with canonical names")
    names = Namer(slots(canon))
    canon[kernel.name] = "pfKERNEL"
    return {
        "function": kernel.canonical.to_json(),
        "params": [[names.tensor(p.tensor), p.ctype] for p in kernel.params],
        "grid": list(kernel.grid),
        "block": list(kernel.block),
        "facts": kernel.facts.to_json() if kernel.facts is not None else None,
        "bytes_read": kernel.bytes_read,
        "bytes_written": kernel.bytes_written,
        "vector_bytes": kernel.vector_bytes,
        "reread_bytes": kernel.reread_bytes,
        "block_read_bytes": kernel.block_read_bytes,
        "tensor_bytes": {rename(t, canon): list(rw) for t, rw in kernel.tensor_bytes.items()},
        "notes": [_note_json(n, canon) for n in kernel.notes],
        "placements": [
            [
                rename(p.tensor, canon),
                p.space,
                rename(p.reason, canon),
                p.register_copy,
                [k.value for k in p.kinds],
            ]
            for p in kp.placements.values()
        ],
        "recomputes": [
            [
                [k.value for k in d.kinds],
                rename(d.reason, canon),
                rename(d.data.tensor, canon),
                [rename(r, canon) for r in d.data.readers],
            ]
            for d in kp.recomputes
        ],
        "layout": [_record_json(d, canon) for d in kp.layout],
        # isl sets without tensor names: only the keys are renamed
        "shared_reads": {rename(t, canon): fp for t, fp in kp.shared_reads.items()},
    }


def _record_json(d: Decided, canon: dict[str, str]) -> list[Any]:
    """A decision record under canonical names, as JSON (:func:`_record_from` reads it)."""
    return [
        [k.value for k in d.kinds],
        rename(d.reason, canon),
        _renamed(d.data.as_dict(), canon),
        type(d.data).__name__,
        [rename(s, canon) for s in d.subject],
        d.made,
    ]


def _record_from(entry: list[Any], back: dict[str, str]) -> Decided:
    """The record :func:`_record_json` wrote, under the current names."""
    kinds, reason, data, type_name, subject, made = entry
    typed = tuple(DecisionKind(k) for k in kinds)
    return Decided(
        typed,
        rename(reason, back),
        typed_data(typed, _renamed(data, back), type_name),
        tuple(rename(s, back) for s in subject),
        made,
    )


def _note_json(note: str, canon: dict[str, str]) -> str | list[Any]:
    """A kernel note as JSON: its text, or its record when it is a decision."""
    if isinstance(note, DecisionNote):
        return _record_json(note.record, canon)
    return rename(note, canon)


def _note_from(entry: str | list[Any], back: dict[str, str]) -> str:
    """The note :func:`_note_json` wrote, under the current names."""
    if isinstance(entry, str):
        return rename(entry, back)
    return DecisionNote(_record_from(entry, back))


def _renamed(data: Any, mapping: dict[str, str]) -> Any:
    """A decision's data with tensor names renamed (strings, list items and dict keys)."""
    if isinstance(data, str):
        return rename(data, mapping)
    if isinstance(data, dict):
        return {_renamed(k, mapping): _renamed(v, mapping) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_renamed(v, mapping) for v in data]
    return data


def kernel_from_entry(
    entry: dict[str, Any], key: StructuralKey, name: str, micrographs: list[str]
) -> tuple[Kernel, KernelPlan]:
    """A cached kernel under the current names (kernel ``name``, this group's tensors)."""
    back = {c: a for a, c in key.canonical().items()}
    real = {c: c_name(a) for c, a in back.items()}
    params = [KParam(fill(n, real), ctype, fill(n, back)) for n, ctype in entry["params"]]
    back["pfKERNEL"] = name
    canonical = KFunction.from_json(entry["function"])
    printed = instantiate_function(canonical, [(p.ctype, p.name) for p in params], real)
    kernel = Kernel(
        name,
        params,
        [],
        tuple(entry["grid"]),
        tuple(entry["block"]),
        micrographs,
        facts=KernelFacts.from_json(entry["facts"]) if entry["facts"] is not None else None,
        source=print_function(printed, name),
        bytes_read=entry["bytes_read"],
        bytes_written=entry["bytes_written"],
        vector_bytes=entry.get("vector_bytes", 0),
        reread_bytes=entry.get("reread_bytes", 0),
        block_read_bytes=entry.get("block_read_bytes"),
        tensor_bytes={rename(t, back): (r, w) for t, (r, w) in entry["tensor_bytes"].items()},
        notes=[_note_from(n, back) for n in entry["notes"]] + ["generated earlier (compile cache)"],
        printed=printed,
        canonical=canonical,
    )
    placements = {}
    for tensor, space, reason, copy, kinds in entry["placements"]:
        t = rename(tensor, back)
        typed = tuple(DecisionKind(k) for k in kinds)
        placements[t] = Placement(t, space, rename(reason, back), register_copy=copy, kinds=typed)
    recomputes = [
        Decided(
            tuple(DecisionKind(k) for k in kinds),
            rename(reason, back),
            RecomputeData(rename(t, back), [rename(r, back) for r in readers]),
            (rename(t, back), *(rename(r, back) for r in readers)),
        )
        for kinds, reason, t, readers in entry["recomputes"]
    ]
    layout = [_record_from(e, back) for e in entry["layout"]]
    return kernel, KernelPlan(
        name,
        [],
        placements,
        names=micrographs,
        cached=True,
        recomputes=recomputes,
        layout=layout,
        shared_reads={rename(t, back): fp for t, fp in entry["shared_reads"].items()},
    )
