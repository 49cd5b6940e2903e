"""Layered layout of the report graph, computed in Python (no JavaScript layout library).

Nested blocks: primitives are layered (longest path) inside their micrograph; micrographs are
stacked in dependence order inside their kernel, under a header row with the graph inputs the
kernel reads; kernels are layered over the kernel DAG and ordered by the barycentre of their
predecessors, one segment (:mod:`polyfuse.viz.groups`) below the other. Boxes never overlap, so
collapsing a kernel is a matter of hiding what is inside. A repeat copy also gets a card: the
same segment folded to one row of chips (one per kernel); the page shifts the segments below a
folded one up by the difference, so every box here is "all expanded" and the page only adds
one vertical offset per segment.
"""

from __future__ import annotations

from typing import Any

NODE_W, NODE_H = 168, 34
PIN_W, PIN_H = 118, 20
HGAP, VGAP = 18, 34
MG_PAD, MG_HEAD = 10, 16
K_PAD, K_HEAD = 12, 22
K_HGAP, K_VGAP = 60, 70
TITLE_CHAR_W, TITLE_MAX_W = 7.4, 420  # a kernel's title bar, estimated (12px bold)
G_PAD, G_HEAD, SEG_GAP = 12, 22, 18  # a repeat copy's frame; space between segments
CARD_W, CARD_HEAD, CARD_PAD = 600, 40, 8  # a folded copy's card
CHIP_W, CHIP_H, CHIP_GAP = 30, 12, 5  # one chip per kernel on a card


def _layers(nodes: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Longest-path layer of each node (``nodes`` in topological order)."""
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        if a in preds and b in preds:
            preds[b].append(a)
    layer: dict[str, int] = {}
    for n in nodes:
        layer[n] = 1 + max((layer[p] for p in preds[n]), default=-1)
    return layer


def _order_rows(rows: list[list[str]], preds: dict[str, list[str]], x: dict[str, float]):
    for row in rows:
        row.sort(
            key=lambda n: (
                sum(x[p] for p in preds.get(n, []) if p in x) / max(1, len(preds.get(n, [])))
                if any(p in x for p in preds.get(n, []))
                else 0.0
            )
        )
        for i, n in enumerate(row):
            x[n] = i * (NODE_W + HGAP)


def _place_rows(
    knames: list[str],
    kedges: list[tuple[str, str]],
    kpreds: dict[str, list[str]],
    k_size: dict[str, tuple[float, float]],
    kpos: dict[str, tuple[float, float]],
    kcx: dict[str, float],
    y: float,
) -> float:
    """Kernels ``knames`` layered over their DAG in rows from ``y``, each row centred on x = 0
    and ordered by the barycentre of the predecessors placed so far; returns the y below."""
    klay = _layers(knames, kedges)  # kernels are in dependence order
    rows: list[list[str]] = [[] for _ in range(1 + max(klay.values(), default=0))]
    for k in knames:
        rows[klay[k]].append(k)
    for r, row in enumerate(rows):
        row.sort(
            key=lambda k: (
                sum(kcx.get(p, 0.0) for p in kpreds[k]) / len(kpreds[k]) if kpreds[k] else 0.0
            )
        )
        total = sum(k_size[k][0] for k in row) + K_HGAP * (len(row) - 1)
        x = -total / 2
        for k in row:
            kpos[k] = (x, y)
            kcx[k] = x + k_size[k][0] / 2
            x += k_size[k][0] + K_HGAP
        y += max(k_size[k][1] for k in row) + (K_VGAP if r + 1 < len(rows) else 0)
    return y


def _card(knames: list[str], top: float) -> tuple[list[float], dict[str, list[float]]]:
    """A folded segment: its card centred on x = 0 at ``top``, one chip per kernel."""
    per_row = (CARD_W - 2 * CARD_PAD + CHIP_GAP) // (CHIP_W + CHIP_GAP)
    chips = {}
    for i, k in enumerate(knames):
        chips[k] = [
            -CARD_W / 2 + CARD_PAD + (i % per_row) * (CHIP_W + CHIP_GAP),
            top + CARD_HEAD + (i // per_row) * (CHIP_H + CHIP_GAP),
            CHIP_W,
            CHIP_H,
        ]
    rows = -(-len(knames) // per_row)
    height = CARD_HEAD + rows * (CHIP_H + CHIP_GAP) - CHIP_GAP + CARD_PAD
    return [-CARD_W / 2, top, CARD_W, height], chips


def layout(data: dict[str, Any]) -> dict[str, Any]:
    prims = data["prims"]
    order = [p["id"] for p in prims]
    pidx = {p["id"]: p for p in prims}
    edges = [(d["producer"], d["consumer"]) for d in data["decisions"]]
    preds: dict[str, list[str]] = {n: [] for n in order}
    for a, b in edges:
        preds[b].append(a)

    # ---- primitives inside each micrograph
    local: dict[str, tuple[float, float]] = {}
    mg_size: dict[str, tuple[float, float]] = {}
    for mg in data["micrographs"]:
        members = [n for n in order if pidx[n]["mg"] == mg["id"]]
        lay = _layers(members, edges)
        nrows = 1 + max(lay.values(), default=0)
        rows: list[list[str]] = [[] for _ in range(nrows)]
        for n in members:
            rows[lay[n]].append(n)
        x: dict[str, float] = {}
        _order_rows(rows, preds, x)
        width = max(len(r) for r in rows) * (NODE_W + HGAP) - HGAP
        for r, row in enumerate(rows):
            shift = (width - (len(row) * (NODE_W + HGAP) - HGAP)) / 2
            for n in row:
                local[n] = (MG_PAD + shift + x[n], MG_HEAD + MG_PAD + r * (NODE_H + VGAP))
        mg_size[mg["id"]] = (
            width + 2 * MG_PAD,
            MG_HEAD + 2 * MG_PAD + nrows * (NODE_H + VGAP) - VGAP,
        )

    # ---- micrographs stacked inside each kernel, input pins on top
    ins_of: dict[str, list[str]] = {}
    for e in data["input_edges"]:
        k = pidx[e["dst"]]["kernel"]
        lst = ins_of.setdefault(k, [])
        if e["src"] not in lst:
            lst.append(e["src"])
    k_size: dict[str, tuple[float, float]] = {}
    mg_off: dict[str, tuple[float, float]] = {}
    pin_off: dict[tuple[str, str], tuple[float, float]] = {}
    for k in data["kernels"]:
        pins = ins_of.get(k["id"], [])
        per_row = 6
        pin_rows = (len(pins) + per_row - 1) // per_row
        y = K_HEAD + K_PAD + pin_rows * (PIN_H + 8)
        width = min(len(pins), per_row) * (PIN_W + 8) - 8 if pins else 0
        # room for the title bar where it is cheap (the page clips what does not fit)
        title = f"▾ {k['id']}  grid {k['grid'][0]} × block {k['block'][0]}"
        width = max(width, min(TITLE_MAX_W, TITLE_CHAR_W * len(title)))
        for m in k["micrographs"]:
            width = max(width, mg_size[m][0])
        for i, pin in enumerate(pins):
            pin_off[(k["id"], pin)] = (
                K_PAD + (i % per_row) * (PIN_W + 8),
                K_HEAD + K_PAD + (i // per_row) * (PIN_H + 8),
            )
        for m in k["micrographs"]:
            w, h = mg_size[m]
            mg_off[m] = (K_PAD + (width - w) / 2, y)
            y += h + 14
        k_size[k["id"]] = (width + 2 * K_PAD, y - 14 + K_PAD)

    # ---- kernels over the kernel DAG, segment by segment (polyfuse.viz.groups)
    knames = [k["id"] for k in data["kernels"]]
    kedges = sorted(
        {
            (pidx[a]["kernel"], pidx[b]["kernel"])
            for a, b in edges
            if pidx[a]["kernel"] != pidx[b]["kernel"]
        }
    )
    kpreds: dict[str, list[str]] = {k: [] for k in knames}
    for a, b in kedges:
        kpreds[b].append(a)
    segs = data.get("groups", {}).get("segments") or [
        {"id": "s0", "kernels": knames, "repeat": None}
    ]
    kpos: dict[str, tuple[float, float]] = {}
    kcx: dict[str, float] = {}
    seg_box: dict[str, list[float]] = {}
    y = 20.0
    for seg in segs:
        framed = seg.get("foldable", False)
        top = y
        y += G_HEAD + G_PAD if framed else 0
        y = _place_rows(seg["kernels"], kedges, kpreds, k_size, kpos, kcx, y)
        xs = [kpos[k][0] for k in seg["kernels"]]
        x0 = min(xs) - (G_PAD if framed else 0)
        x1 = max(kpos[k][0] + k_size[k][0] for k in seg["kernels"]) + (G_PAD if framed else 0)
        y += G_PAD if framed else 0
        seg_box[seg["id"]] = [x0, top, x1 - x0, y - top]
        y += SEG_GAP
    cards = {seg["id"]: _card(seg["kernels"], seg_box[seg["id"]][1]) for seg in segs}
    minx = min(
        [p[0] for p in kpos.values()]
        + [b[0] for b in seg_box.values()]
        + [c[0][0] for c in cards.values()],
        default=0.0,
    )
    for k in kpos:
        kpos[k] = (kpos[k][0] - minx + 20, kpos[k][1])
    for b in seg_box.values():
        b[0] += -minx + 20
    for box, chips in cards.values():
        box[0] += -minx + 20
        for c in chips.values():
            c[0] += -minx + 20

    # ---- absolute boxes
    out_k = {}
    for k in knames:
        x, y = kpos[k]
        out_k[k] = [x, y, *k_size[k]]
    out_mg = {}
    mg_kernel = {m: k["id"] for k in data["kernels"] for m in k["micrographs"]}
    for m, (ox, oy) in mg_off.items():
        kx, ky = kpos[mg_kernel[m]]
        out_mg[m] = [kx + ox, ky + oy, *mg_size[m]]
    out_n = {}
    for n in order:
        mx, my = out_mg[pidx[n]["mg"]][:2]
        lx, ly = local[n]
        out_n[n] = [mx + lx, my + ly, NODE_W, NODE_H]
    out_pins = []
    for (k, pin), (ox, oy) in pin_off.items():
        kx, ky = kpos[k]
        out_pins.append({"id": pin, "kernel": k, "box": [kx + ox, ky + oy, PIN_W, PIN_H]})
    out_c = {}
    for c in data["composites"]:
        boxes = [out_n[p] for p in c["prims"]]
        x0 = min(b[0] for b in boxes) - 5
        y0 = min(b[1] for b in boxes) - 5
        x1 = max(b[0] + b[2] for b in boxes) + 5
        y1 = max(b[1] + b[3] for b in boxes) + 5
        out_c[c["id"]] = [x0, y0, x1 - x0, y1 - y0]
    width = max((b[0] + b[2] for b in [*out_k.values(), *seg_box.values()]), default=100) + 20
    height = max((b[1] + b[3] for b in out_k.values()), default=100) + 20
    rnd = lambda b: [round(v, 1) for v in b]  # noqa: E731
    return {
        "width": round(width, 1),
        "height": round(height, 1),
        "kernels": {k: rnd(v) for k, v in out_k.items()},
        "micrographs": {k: rnd(v) for k, v in out_mg.items()},
        "nodes": {k: rnd(v) for k, v in out_n.items()},
        "pins": [dict(p, box=rnd(p["box"])) for p in out_pins],
        "composites": {k: rnd(v) for k, v in out_c.items()},
        "segments": {
            sid: {
                "box": rnd(seg_box[sid]),
                "card": rnd(cards[sid][0]),
                "chips": {k: rnd(c) for k, c in cards[sid][1].items()},
            }
            for sid in seg_box
        },
    }
