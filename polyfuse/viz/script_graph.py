# ruff: noqa: E501  (JavaScript inside a string)
"""The report page's graph: loading the data, drawing, folding, labels, minimap, pan/zoom.

Runs first inside the page's one async function (:mod:`polyfuse.viz.template`); the names it
defines (``D``, ``L``, ``relayout``, ``reveal``, ``centerOn``…) are used by
:mod:`polyfuse.viz.script_panels`, which follows it in the same scope.

Every box comes from :mod:`polyfuse.viz.layout` ("all expanded"); folding a repeated block into
its card moves the segments below it up, by one ``translate`` per segment. Fixed labels (kernel,
micrograph, node, pin, card titles) are clipped to their box with an ellipsis, measured with a
canvas in the page's own font; movable labels (edge tensors, composite tags) are placed
greedily where they overlap no other label or box, and hidden where no place is free.
"""

SCRIPT_GRAPH = r"""
const NS = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
async function loadData(){
  const bin = atob($("report-data").textContent.trim());
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}
let D;
try { D = await loadData(); }
catch (e) { $("fatal").hidden = false; $("fatal").textContent = "The report data could not be read (" + e + "); this page needs a browser with DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+), or use --json."; throw e; }
const L = D.layout, G = D.groups;
const KIND_COLORS = {elementwise:"#cfe8cf", broadcast:"#cde0f7", reduction:"#f9d9a8", opaque:"#e3d2f0", injective:"#f0e0c0"};
const esc = (s) => String(s == null ? "" : s).replace(/[&<>"]/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;"}[c]));
const el = (tag, attrs, parent) => { const e = document.createElementNS(NS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; };
const fmtB = (n) => n == null ? "?" : n >= 1048576 ? (n/1048576).toFixed(2)+" MiB" : n >= 1024 ? (n/1024).toFixed(1)+" KiB" : n+" B";
const fmtS = (s) => s >= 1e-3 ? (s*1e3).toFixed(3)+" ms" : s >= 1e-6 ? (s*1e6).toFixed(2)+" µs" : (s*1e9).toFixed(1)+" ns";
const kindPills = (ks) => ks.map((k) => `<span class="pill k-${k.replace(/ /g,"-")}">${esc(k)}</span>`).join("");
const primById = {}; D.prims.forEach((p) => primById[p.id] = p);
const mgById = {}; D.micrographs.forEach((m) => mgById[m.id] = m);
const kById = {}; D.kernels.forEach((k) => kById[k.id] = k);
const segById = {}, segOf = {};
G.segments.forEach((s) => { segById[s.id] = s; s.kernels.forEach((k) => segOf[k] = s); });
const repeatSegs = G.segments.filter((s) => s.foldable);  // every segment, where layers repeat

$("title").textContent = D.name + " (" + D.arch + ")";
$("n-prims").textContent = D.counts.primitives;
$("n-mgs").textContent = D.counts.micrographs;
$("n-kernels").textContent = D.counts.kernels;
$("n-decs").textContent = D.counts.decisions;
$("bytes").textContent = "global " + fmtB(D.bytes.global) + " / compulsory " + fmtB(D.bytes.compulsory);
$("bytes").title = "global-memory bytes moved by all kernels (isl footprints) / bytes every graph input and output must move once";
if (G.repeats.length) {
  $("layers-stat").hidden = $("fold-layers").hidden = $("unfold-layers").hidden = false;
  $("n-layers").textContent = "repeated blocks " + G.repeats.map((r) => r.count + "×" + r.period).join(", ") + " kernels";
  $("n-layers").title = G.repeats.map((r) => r.count + " copies of a block of " + r.period + " kernels").join("; ");
}
$("legend").innerHTML = Object.keys(KIND_COLORS).map((k) => `<span class="sw" style="background:${KIND_COLORS[k]}"></span>${k}`).join("") +
  '<br><span class="sw" style="background:#3a3"></span>fused <span class="sw" style="background:#36c"></span>stitched <span class="sw" style="background:#d33"></span>not fused (click for why) <span class="sw" style="border:1px dashed #b46"></span>composite';

// ------------------------------------------------------------------ text measurement
const FAMILY = getComputedStyle(document.body).fontFamily;
const mctx = document.createElement("canvas").getContext("2d");
const vmet = {};
const fontOf = (px, bold) => (bold ? "600 " : "") + px + "px " + FAMILY;
function textW(s, px, bold){ mctx.font = fontOf(px, bold); return mctx.measureText(s).width; }
function vmetric(px, bold){
  const k = px + (bold ? "b" : "");
  if (!vmet[k]) { mctx.font = fontOf(px, bold); const m = mctx.measureText("Hgy"); vmet[k] = [m.fontBoundingBoxAscent || px * 0.95, m.fontBoundingBoxDescent || px * 0.3]; }
  return vmet[k];
}
function clip(s, px, maxW, bold){
  if (textW(s, px, bold) <= maxW) return s;
  let lo = 0, hi = s.length;
  while (lo < hi) { const m = (lo + hi + 1) >> 1; if (textW(s.slice(0, m) + "…", px, bold) <= maxW) lo = m; else hi = m - 1; }
  return s.slice(0, lo) + "…";
}
// fixed labels: text clipped to maxW; their boxes (before the segment's shift) are obstacles
const fixed = [];
function label(parent, owner, seg, x, y, s, px, maxW, cls, bold){
  const t = el("text", {x:x, y:y, "font-size":px, "class":cls || ""}, parent);
  if (bold) t.setAttribute("font-weight", "600");
  const item = {t:t, g:owner, seg:seg, x:x, y:y, px:px, maxW:maxW, bold:bold, box:null};
  setLabel(item, s);
  fixed.push(item);
  return item;
}
function setLabel(item, s){
  if (item.s === s) return;
  item.s = s;
  const shown = clip(s, item.px, item.maxW, item.bold);
  item.t.textContent = shown;
  if (shown !== s) el("title", {}, item.t).textContent = s;  // the whole text on hover
  const [a, d] = vmetric(item.px, item.bold);
  item.box = [item.x, item.y - a, textW(shown, item.px, item.bold), a + d];
}

// ------------------------------------------------------------------ graph drawing
const svg = $("graph"), vp = $("viewport");
const gS = el("g", {id:"layer-segments"}, vp), gK = el("g", {id:"layer-kernels"}, vp), gC = el("g", {id:"layer-comps"}, vp);
const gE = el("g", {id:"layer-edges"}, vp), gD = el("g", {id:"layer-cards"}, vp);  // cards over edges
const gN = el("g", {id:"layer-nodes"}, vp), gL = el("g", {id:"layer-labels"}, vp);
// per segment, one group in each layer: [frame, kernels, composites, pins and nodes, card]
const segG = {};
G.segments.forEach((s) => { segG[s.id] = [gS, gK, gC, gN, gD].map((layer) => el("g", {"class":"seg", "data-seg":s.id}, layer)); });
const kernelG = {}, kTitle = {}, mgG = {}, nodeG = {}, compG = {}, frameG = {}, cardG = {}, chipG = {}, edgeG = [], pinG = [];
const collapsedK = new Set(), collapsedC = new Set();
const collapsedG = new Set(G.collapse_at_load ? repeatSegs.map((s) => s.id) : []);
const shift = {};
G.segments.forEach((s) => shift[s.id] = 0);
let curH = L.height;

function segName(s){
  return (s.label ? s.label + " · " : "") + (s.repeat === null ? "not repeated" : "block " + (s.copy + 1) + " of " + s.count);
}
function mainKind(k){
  const kinds = new Set(k.micrographs.map((m) => mgById[m].kind));
  return ["opaque", "reduction", "broadcast", "elementwise"].find((x) => kinds.has(x)) || "elementwise";
}
function segStats(s){
  const ks = new Set(s.kernels), n = {fused:0, stitched:0, separate:0};
  let ops = 0, t = 0;
  D.prims.forEach((p) => { if (ks.has(p.kernel)) ops++; });
  D.decisions.forEach((d) => { if (ks.has(d.kernel_producer) && ks.has(d.kernel_consumer)) n[d.outcome]++; });
  s.kernels.forEach((k) => t += kById[k].modelled.total_s);
  return `${s.kernels.length} kernels · ${ops} ops · edges: ${n.fused} fused, ${n.stitched} stitched, ${n.separate} not fused · ${fmtS(t)} (modelled)`;
}
repeatSegs.forEach((s) => {
  const sl = L.segments[s.id], b = sl.box, cb = sl.card;
  const f = el("g", {"class":"frame", "data-seg":s.id}, segG[s.id][0]);
  el("rect", {x:b[0], y:b[1], width:b[2], height:b[3], rx:8}, f);
  const ft = label(f, f, s.id, b[0] + 10, b[1] + 16, "▾ " + segName(s) + " · " + s.kernels.length + " kernels · click to fold", 12, b[2] - 20, "fhead", true);
  ft.t.addEventListener("click", (ev) => { ev.stopPropagation(); toggleSeg(s.id); });
  frameG[s.id] = f;
  const c = el("g", {"class":"card", "data-seg":s.id}, segG[s.id][4]);
  el("rect", {"class":"cardbox", x:cb[0], y:cb[1], width:cb[2], height:cb[3], rx:8}, c);
  label(c, c, s.id, cb[0] + 10, cb[1] + 17, "▸ " + segName(s), 14, cb[2] - 20, "ctitle", true);
  label(c, c, s.id, cb[0] + 10, cb[1] + 33, segStats(s), 11, cb[2] - 20, "cstats");
  s.kernels.forEach((k) => {
    const x = sl.chips[k];
    const r = el("rect", {"class":"chip", "data-kernel":k, x:x[0], y:x[1], width:x[2], height:x[3], rx:3, fill:KIND_COLORS[mainKind(kById[k])]}, c);
    el("title", {}, r).textContent = k + " (" + kById[k].micrographs.length + " micrographs, " + fmtS(kById[k].modelled.total_s) + " modelled): click to open";
    r.addEventListener("click", (ev) => { ev.stopPropagation(); reveal(k); showKernel(k); centerOn(boxNow(L.kernels[k], k)); });
    chipG[k] = r;
  });
  el("title", {}, c).textContent = segName(s) + ": click to unfold";
  c.addEventListener("click", (ev) => { ev.stopPropagation(); toggleSeg(s.id); });
  cardG[s.id] = c;
});
function kernelTitle(k, c){
  return (c ? "▸ " : "▾ ") + k.id + "  grid " + k.grid[0] + " × block " + k.block[0] + (c ? "  [" + k.micrographs.join(", ") + "]" : "");
}
// A segment's kernels, micrographs, composites, pins and nodes are drawn when it is first
// shown: a folded block costs the page one card, not its hundreds of elements.
const comps = D.composites.filter((c) => c.prims.length > 1);  // one primitive: its node says it
const bySeg = (list, kernelOf) => { const m = {}; G.segments.forEach((s) => m[s.id] = []); list.forEach((x) => m[segOf[kernelOf(x)].id].push(x)); return m; };
const primsOf = bySeg(D.prims, (p) => p.kernel), compsOf = bySeg(comps, (c) => primById[c.prims[0]].kernel), pinsOf = bySeg(L.pins, (p) => p.kernel);
const built = new Set();
function build(sid){
  if (built.has(sid)) return;
  built.add(sid);
  segById[sid].kernels.forEach((kid) => {
    const k = kById[kid], b = L.kernels[kid];
    const g = el("g", {"class":"kernel", "data-id":kid}, segG[sid][1]);
    el("rect", {"class":"box", x:b[0], y:b[1], width:b[2], height:b[3], rx:6}, g);
    const t = label(g, g, sid, b[0] + 8, b[1] + 15, kernelTitle(k, false), 12, b[2] - 16, "ktitle", true);
    t.t.addEventListener("click", (ev) => { ev.stopPropagation(); if (ev.shiftKey) toggleKernel(kid); else showKernel(kid); });
    t.t.addEventListener("dblclick", (ev) => { ev.stopPropagation(); toggleKernel(kid); });
    kernelG[kid] = g; kTitle[kid] = t;
    k.micrographs.forEach((m) => {
      const mb = L.micrographs[m], info = mgById[m];
      const mg = el("g", {"class":"mg", "data-id":m}, g);
      el("rect", {x:mb[0], y:mb[1], width:mb[2], height:mb[3], rx:4}, mg);
      const mt = label(mg, mg, sid, mb[0] + 5, mb[1] + 12, m + " · " + info.kind + (info.canonical ? " · " + info.canonical : ""), 10, mb[2] - 10, "mgtitle");
      mt.t.addEventListener("click", (ev) => { ev.stopPropagation(); showMicrograph(m); });
      mgG[m] = mg;
    });
  });
  compsOf[sid].forEach((c) => {
    const b = L.composites[c.id];
    const g = el("g", {"class":"comp", "data-id":c.id}, segG[sid][2]);
    el("rect", {x:b[0], y:b[1], width:b[2], height:b[3], rx:5}, g);
    const t = el("text", {"class":"ctag", "font-size":10}, gL);
    t.textContent = c.tag;
    el("title", {}, t).textContent = c.tag + " (" + c.prims.length + " primitives): click to fold";
    t.addEventListener("click", (ev) => { ev.stopPropagation(); toggleComp(c.id); });
    compG[c.id] = {g:g, tag:t, c:c, seg:sid, w:textW(c.tag, 10)};
  });
  pinsOf[sid].forEach((p) => {
    const g = el("g", {"class":"pin", "data-id":p.id, "data-kernel":p.kernel}, segG[sid][3]);
    const b = p.box, inp = inputById[p.id];
    el("rect", {x:b[0], y:b[1], width:b[2], height:b[3]}, g);
    label(g, g, sid, b[0] + 7, b[1] + 14, (inp && inp.constant ? "◆ " : "▸ ") + p.id, 10, b[2] - 12, "");
    el("title", {}, g).textContent = p.id + " " + JSON.stringify(inp ? inp.shape : []) + (inp && inp.constant ? " (constant)" : " (graph input)");
    pinG.push({g:g, pin:p, seg:sid});
  });
  primsOf[sid].forEach((p) => {
    const b = L.nodes[p.id];
    const g = el("g", {"class":"node" + (p.output ? " out" : ""), "data-id":p.id, "data-kind":p.kind}, segG[sid][3]);
    el("rect", {x:b[0], y:b[1], width:b[2], height:b[3], fill:KIND_COLORS[p.kind] || "#ddd"}, g);
    label(g, g, sid, b[0] + 6, b[1] + 14, p.id, 11, b[2] - 12, "");
    label(g, g, sid, b[0] + 6, b[1] + 28, p.kind + " " + JSON.stringify(p.shape) + (p.output ? " → output" : ""), 10, b[2] - 12, "sub").t.setAttribute("fill", "#555");
    el("title", {}, g).textContent = p.text;
    g.addEventListener("click", (ev) => { ev.stopPropagation(); selectPrim(p.id); });
    nodeG[p.id] = g;
  });
}
const inputById = {}; D.inputs.forEach((i) => inputById[i.id] = i);
const pinAt = {}; L.pins.forEach((p) => pinAt[p.id + "@" + p.kernel] = p);
// edges: drawn when first shown
D.decisions.forEach((d) => edgeG.push({src:d.producer, dst:d.consumer, dec:d, cls:d.outcome, text:d.tensor + " " + JSON.stringify(d.shape)}));
D.input_edges.forEach((ie) => {
  const k = primById[ie.dst].kernel, pin = pinAt[ie.src + "@" + k];
  if (pin) edgeG.push({pin:pin, dst:ie.dst, dec:null, kernel:k, cls:"input", text:""});
});
function edgeDom(e){
  if (e.g) return;
  const g = e.g = el("g", {"class":"edge " + e.cls}, gE);
  e.vis = el("path", {"class":"vis"}, g); e.hit = el("path", {"class":"hit"}, g);
  e.lab = e.text ? el("text", {"class":"elabel", "font-size":9}, gL) : null;
  if (e.lab) { e.lab.textContent = e.text; e.w = textW(e.text, 9); }
  const d = e.dec;
  if (d) {
    g.setAttribute("data-dec", d.id); g.setAttribute("data-outcome", d.outcome);
    e.hit.addEventListener("click", (ev) => { ev.stopPropagation(); selectDecision(d.id, true); });
    el("title", {}, g).textContent = d.summary + "\n" + d.plain;
  }
}

// ------------------------------------------------------------------ folding and layout
const moved = (b, sid) => [b[0], b[1] + shift[sid], b[2], b[3]];
const boxNow = (b, kernel) => moved(b, segOf[kernel].id);
function anchorOf(pid){
  const p = primById[pid], s = segOf[p.kernel];
  if (collapsedG.has(s.id)) return {key:"s:" + s.id, box:moved(L.segments[s.id].card, s.id), node:false};
  if (collapsedK.has(p.kernel)) return {key:"k:" + p.kernel, box:moved(L.kernels[p.kernel], s.id), node:false};
  if (p.comp && collapsedC.has(p.comp)) return {key:"c:" + p.comp, box:moved(L.composites[p.comp], s.id), node:false};
  return {key:"n:" + pid, box:moved(L.nodes[pid], s.id), node:true};
}
function curve(a, c){ const dy = Math.max(14, (c[1] - a[1]) / 2); return [a, [a[0], a[1] + dy], [c[0], c[1] - dy], c]; }
function bez(P, t){ const u = 1 - t; return [0, 1].map((i) => u*u*u*P[0][i] + 3*u*u*t*P[1][i] + 3*u*t*t*P[2][i] + t*t*t*P[3][i]); }
const hidden = (g) => !g || g.classList.contains("hidden");
function relayout(){
  let acc = 0;
  G.segments.forEach((s) => {
    shift[s.id] = acc;
    if (collapsedG.has(s.id)) acc += L.segments[s.id].card[3] - L.segments[s.id].box[3];
    else build(s.id);
    segG[s.id].forEach((g) => g.setAttribute("transform", `translate(0,${shift[s.id]})`));
  });
  curH = L.height + acc;
  repeatSegs.forEach((s) => { const f = collapsedG.has(s.id); frameG[s.id].classList.toggle("hidden", f); cardG[s.id].classList.toggle("hidden", !f); });
  G.segments.forEach((s) => {
    if (!built.has(s.id)) return;
    const f = collapsedG.has(s.id);
    [1, 2, 3].forEach((i) => segG[s.id][i].classList.toggle("hidden", f));
    if (f) return;
    s.kernels.forEach((kid) => {
      const c = collapsedK.has(kid);
      kernelG[kid].classList.toggle("collapsed", c);
      setLabel(kTitle[kid], kernelTitle(kById[kid], c));
      kById[kid].micrographs.forEach((m) => mgG[m].classList.toggle("hidden", c));
    });
    primsOf[s.id].forEach((p) => nodeG[p.id].classList.toggle("hidden", !!(collapsedK.has(p.kernel) || (p.comp && collapsedC.has(p.comp)))));
    compsOf[s.id].forEach((c) => {
      compG[c.id].g.classList.toggle("hidden", c.prims.some((p) => collapsedK.has(primById[p].kernel)));
      compG[c.id].g.classList.toggle("collapsed", collapsedC.has(c.id));
    });
  });
  pinG.forEach((p) => p.g.classList.toggle("hidden", collapsedK.has(p.pin.kernel)));
  const drawn = new Set();
  edgeG.forEach((e) => {
    let a, b, hide;
    if (e.dec) {
      a = anchorOf(e.src); b = anchorOf(e.dst);
      const pair = a.key + ">" + b.key;
      hide = a.key === b.key || (!(a.node && b.node) && drawn.has(pair));
      drawn.add(pair);
    } else {
      b = anchorOf(e.dst);
      hide = !b.node;
      a = {box:moved(e.pin.box, segOf[e.kernel].id), node:true};
    }
    e.shown = !hide && a.node && b.node;
    if (hide) { if (e.g) { e.g.classList.add("hidden"); if (e.lab) e.lab.classList.add("hidden"); } return; }
    edgeDom(e);
    e.g.classList.remove("hidden");
    e.g.classList.toggle("folded", !(a.node && b.node));
    e.P = curve([a.box[0] + a.box[2]/2, a.box[1] + a.box[3]], [b.box[0] + b.box[2]/2, b.box[1]]);
    const d = `M${e.P[0]} C${e.P[1]} ${e.P[2]} ${e.P[3]}`;
    e.vis.setAttribute("d", d); e.hit.setAttribute("d", d);
  });
  placeLabels();
  drawMinimap();
}
// movable labels: composite tags first, then edge tensors, each at the first free place
function placeLabels(){
  const C = 64, grid = new Map();
  const each = (b, f) => { for (let i = Math.floor(b[0] / C); i <= Math.floor((b[0] + b[2]) / C); i++) for (let j = Math.floor(b[1] / C); j <= Math.floor((b[1] + b[3]) / C); j++) f(i + "," + j); };
  const add = (b) => each(b, (k) => { let l = grid.get(k); if (!l) grid.set(k, l = []); l.push(b); });
  const free = (b) => { let ok = true; each(b, (k) => { const l = ok && grid.get(k); if (l) for (const o of l) if (b[0] < o[0] + o[2] && o[0] < b[0] + b[2] && b[1] < o[1] + o[3] && o[1] < b[1] + b[3]) { ok = false; break; } }); return ok; };
  const P = 1.5, pad = (b) => [b[0] - P, b[1] - P, b[2] + 2*P, b[3] + 2*P];
  fixed.forEach((f) => { if (!hidden(f.g) && !(collapsedG.has(f.seg) && f.g !== cardG[f.seg])) add(pad(moved(f.box, f.seg))); });
  D.prims.forEach((p) => { const sid = segOf[p.kernel].id; if (!collapsedG.has(sid) && !hidden(nodeG[p.id])) add(moved(L.nodes[p.id], sid)); });
  pinG.forEach((p) => { if (!collapsedG.has(p.seg) && !hidden(p.g)) add(moved(p.pin.box, p.seg)); });
  repeatSegs.forEach((s) => { if (collapsedG.has(s.id)) add(moved(L.segments[s.id].card, s.id)); });
  const [a10, d10] = vmetric(10), [a9, d9] = vmetric(9);
  Object.values(compG).forEach((c) => {
    const b = moved(L.composites[c.c.id], c.seg), w = c.w;
    const spots = [[b[0] + b[2] - w, b[1] - 2], [b[0], b[1] - 2], [b[0] + b[2] - w, b[1] + b[3] + a10], [b[0] + b[2] + 4, b[1] + a10]];
    const at = hidden(c.g) || collapsedG.has(c.seg) ? null : spots.find(([x, y]) => free(pad([x, y - a10, w, a10 + d10])));
    c.tag.classList.toggle("hidden", !at);
    if (at) { c.tag.setAttribute("x", at[0]); c.tag.setAttribute("y", at[1]); add(pad([at[0], at[1] - a10, w, a10 + d10])); }
  });
  const TS = [0.5, 0.4, 0.6, 0.3, 0.7, 0.22, 0.78];
  edgeG.forEach((e) => {
    if (!e.lab) return;
    let at = null;
    if (e.shown) {
      for (const t of TS) {
        const p = bez(e.P, t);
        for (const x of [p[0] + 4, p[0] - 4 - e.w]) {
          const box = pad([x, p[1] + a9 / 2 - a9, e.w, a9 + d9]);
          if (free(box)) { at = [x, p[1] + a9 / 2]; add(box); break; }
        }
        if (at) break;
      }
    }
    e.lab.classList.toggle("hidden", !at);
    if (at) { e.lab.setAttribute("x", at[0].toFixed(1)); e.lab.setAttribute("y", at[1].toFixed(1)); }
  });
}
function toggleKernel(id){ collapsedK.has(id) ? collapsedK.delete(id) : collapsedK.add(id); relayout(); }
function toggleComp(id){ collapsedC.has(id) ? collapsedC.delete(id) : collapsedC.add(id); relayout(); }
function toggleSeg(id){
  const b = L.segments[id].box, before = shift[id];
  collapsedG.has(id) ? collapsedG.delete(id) : collapsedG.add(id);
  relayout();
  view.y -= (shift[id] - before) * view.s;  // keep the block where it was on screen
  apply();
  if (!collapsedG.has(id) && b) centerTop(moved(b, id));
}
// make what holds kernel ``k`` visible (unfold its block, expand the kernel); true if changed
function reveal(k){
  const s = segOf[k];
  let changed = false;
  if (s && collapsedG.has(s.id)) { collapsedG.delete(s.id); changed = true; }
  if (collapsedK.has(k)) { collapsedK.delete(k); changed = true; }
  if (changed) relayout();
  return changed;
}
$("collapse-all").addEventListener("click", () => { D.kernels.forEach((k) => collapsedK.add(k.id)); relayout(); });
$("expand-all").addEventListener("click", () => { collapsedK.clear(); collapsedC.clear(); collapsedG.clear(); relayout(); fit(); });
$("fold-layers").addEventListener("click", () => { repeatSegs.forEach((s) => collapsedG.add(s.id)); relayout(); fit(); });
$("unfold-layers").addEventListener("click", () => { collapsedG.clear(); relayout(); fit(); });

// ------------------------------------------------------------------ pan / zoom / minimap
let view = {x:0, y:0, s:1};
function apply(){
  vp.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.s})`);
  svg.classList.toggle("nolabels", view.s < 0.7);
  drawMinimap();
}
function extent(){
  let x0 = Infinity, x1 = -Infinity;
  G.segments.forEach((s) => { const b = collapsedG.has(s.id) ? L.segments[s.id].card : L.segments[s.id].box; x0 = Math.min(x0, b[0]); x1 = Math.max(x1, b[0] + b[2]); });
  return [x0 - 20, 0, x1 - x0 + 40, curH];
}
function fit(){
  // the toolbar (top left), minimap (top right) and legend (bottom left) keep their places
  const r = svg.getBoundingClientRect(), e = extent(), top = $("toolbar").offsetHeight;
  const W = (r.width || 800) - $("minimap-box").offsetWidth - 16, H = (r.height || 600) - top - $("legend").offsetHeight - 12;
  let s = Math.min(W / e[2], H / e[3], 1.2);
  if (s < 0.75) s = Math.min(1, W / e[2]);  // too small to read: fit the width, start at the top
  view = {s:s, x:(W - e[2] * s) / 2 - e[0] * s, y:top + Math.max(0, (H - e[3] * s) / 2)};
  apply();
}
function centerOn(b){
  const r = svg.getBoundingClientRect();
  view.s = Math.min(Math.max(view.s, 0.9), 1.6);  // close enough to read, far enough to see around
  view.x = r.width/2 - (b[0] + b[2]/2) * view.s; view.y = r.height/2 - (b[1] + Math.min(b[3], r.height / view.s * 0.8)/2) * view.s; apply();
}
function centerTop(b){
  const r = svg.getBoundingClientRect();
  view.s = Math.max(view.s, Math.min(1, r.width / (b[2] + 40)));
  view.x = r.width/2 - (b[0] + b[2]/2) * view.s; view.y = $("toolbar").offsetHeight + 14 - b[1] * view.s; apply();
}
let drag = null;
svg.addEventListener("mousedown", (ev) => { drag = {x:ev.clientX, y:ev.clientY, vx:view.x, vy:view.y, moved:false}; svg.style.cursor = "grabbing"; });
window.addEventListener("mousemove", (ev) => { if (!drag) return; const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y; if (Math.abs(dx) + Math.abs(dy) > 2) drag.moved = true; view.x = drag.vx + dx; view.y = drag.vy + dy; apply(); });
window.addEventListener("mouseup", () => { drag = null; svg.style.cursor = "grab"; });
svg.addEventListener("wheel", (ev) => {
  ev.preventDefault();
  const r = svg.getBoundingClientRect(), mx = ev.clientX - r.left, my = ev.clientY - r.top;
  const f = Math.exp(-ev.deltaY * 0.0015), s = Math.min(4, Math.max(0.02, view.s * f));
  view.x = mx - (mx - view.x) * s / view.s; view.y = my - (my - view.y) * s / view.s; view.s = s; apply();
}, {passive:false});
$("fit").addEventListener("click", fit);
const mm = $("minimap"), mmc = mm.getContext("2d"), MM_W = 140;
let mmScale = 1, mmOff = 0;
function drawMinimap(){
  const e = extent(), maxH = Math.max(120, svg.clientHeight * 0.45);
  let m = MM_W / e[2], h = e[3] * m;
  if (h > maxH) { m = maxH / e[3]; h = maxH; }
  const dpr = window.devicePixelRatio || 1;
  if (mm.width !== Math.round(MM_W * dpr) || mm.height !== Math.round(h * dpr)) {
    mm.width = Math.round(MM_W * dpr); mm.height = Math.round(h * dpr); mm.style.width = MM_W + "px"; mm.style.height = h + "px";
  }
  mmScale = m; mmOff = (MM_W - e[2] * m) / 2 - e[0] * m;
  const X = (x) => mmOff + x * m, Y = (y) => y * m;
  mmc.setTransform(dpr, 0, 0, dpr, 0, 0);
  mmc.clearRect(0, 0, MM_W, h);
  mmc.font = "9px " + FAMILY; mmc.textBaseline = "middle";
  G.segments.forEach((s) => {
    if (collapsedG.has(s.id)) {
      const b = moved(L.segments[s.id].card, s.id);
      mmc.fillStyle = "#c9d6ee"; mmc.fillRect(X(b[0]), Y(b[1]), b[2] * m, Math.max(1, b[3] * m));
      if (b[3] * m >= 9) { mmc.fillStyle = "#234"; mmc.fillText(clip(segName(s), 9, b[2] * m - 6), X(b[0]) + 3, Y(b[1] + b[3] / 2)); }
      return;
    }
    if (s.foldable) { const b = moved(L.segments[s.id].box, s.id); mmc.strokeStyle = "#8a9cc0"; mmc.strokeRect(X(b[0]), Y(b[1]), b[2] * m, b[3] * m); }
    s.kernels.forEach((k) => { const b = moved(L.kernels[k], s.id); mmc.fillStyle = collapsedK.has(k) ? "#c9d6ee" : KIND_COLORS[mainKind(kById[k])]; mmc.fillRect(X(b[0]), Y(b[1]), Math.max(1, b[2] * m), Math.max(1, b[3] * m)); });
  });
  const r = svg.getBoundingClientRect();
  mmc.strokeStyle = "#f5a623"; mmc.lineWidth = 2;
  mmc.strokeRect(X(-view.x / view.s), Y(-view.y / view.s), r.width / view.s * m, r.height / view.s * m);
  mmc.lineWidth = 1;
}
function minimapGo(ev){
  const r = mm.getBoundingClientRect(), sr = svg.getBoundingClientRect();
  const gx = (ev.clientX - r.left - mmOff) / mmScale, gy = (ev.clientY - r.top) / mmScale;
  view.x = sr.width / 2 - gx * view.s; view.y = sr.height / 2 - gy * view.s; apply();
}
let mmDrag = false;
mm.addEventListener("mousedown", (ev) => { mmDrag = true; minimapGo(ev); ev.stopPropagation(); });
window.addEventListener("mousemove", (ev) => { if (mmDrag) minimapGo(ev); });
window.addEventListener("mouseup", () => { mmDrag = false; });
"""
