# ruff: noqa: E501  (HTML, CSS and JavaScript inside a string)
"""The report page: our own CSS and JavaScript, no third-party code, no network.

``__DATA__`` is replaced by the report JSON (with ``</`` escaped) inside a
``<script type="application/json">`` element; the script below draws it as SVG.
"""

TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>polyfuse report: __TITLE__</title>
<style>
:root{--bg:#fbfbfa;--fg:#222;--mut:#667;--line:#ccd;--sel:#f5a623}
*{box-sizing:border-box}
body{margin:0;font:13px/1.35 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;color:var(--fg);background:var(--bg);height:100vh;display:flex;flex-direction:column}
header{display:flex;gap:14px;align-items:center;padding:6px 10px;border-bottom:1px solid var(--line);background:#fff;flex-wrap:wrap}
header h1{font-size:15px;margin:0}
header .stat b{font-variant-numeric:tabular-nums}
header input{padding:3px 6px;width:200px}
header button{padding:2px 8px}
main{flex:1;display:flex;min-height:0}
#graphwrap{flex:1 1 58%;position:relative;overflow:hidden;border-right:1px solid var(--line);background:#fff}
#graph{width:100%;height:100%;cursor:grab;user-select:none}
#side{flex:1 1 42%;display:flex;flex-direction:column;min-width:340px}
#tabs{display:flex;border-bottom:1px solid var(--line);background:#fff}
#tabs button{border:0;background:none;padding:7px 12px;cursor:pointer;border-bottom:2px solid transparent}
#tabs button.on{border-bottom-color:#36c;font-weight:600}
.view{display:none;overflow:auto;padding:8px 12px;flex:1}
.view.on{display:block}
pre{background:#f4f4f2;padding:6px;overflow:auto;font:12px/1.35 ui-monospace,Menlo,Consolas,monospace;white-space:pre;margin:4px 0}
pre.wrap{white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #eee;padding:3px 4px;text-align:left;vertical-align:top}
tr.dec{cursor:pointer}
tr.dec:hover{background:#f0f4ff}
tr.dec.sel{background:#fff3d6}
.pill{display:inline-block;border-radius:8px;padding:0 6px;margin:0 2px 1px 0;font-size:11px;background:#eee}
.k-fused{background:#d9f2d9}.k-stitched{background:#d6e6ff}.k-no-rule{background:#eee}.k-cycle{background:#ffe0c2}
.k-isl-feedback{background:#f6d5f7}.k-form-mismatch{background:#ffd6d6}.k-tile-mismatch{background:#ffd6d6}
.k-footprint{background:#fff0a8}.k-cost-model{background:#dff7f4}
.src .ln{display:block}
.src .part{border-left:4px solid transparent;padding-left:4px}
.src .hl{background:#fff3c4}
h2{font-size:14px;margin:10px 0 4px}
h3{font-size:13px;margin:8px 0 3px}
.mut{color:var(--mut)}
.node rect{stroke:#555;stroke-width:1;rx:4}
.node text{font-size:11px;pointer-events:none}
.node{cursor:pointer}
.node.out rect{stroke-width:2.5}
.node.sel rect,.node.match rect{stroke:var(--sel);stroke-width:3}
.kernel>rect.box{fill:#f3f6fb;stroke:#7a8fb5;stroke-width:1.5}
.kernel>text{font-size:12px;font-weight:600;fill:#345;cursor:pointer}
.kernel.sel>rect.box{stroke:var(--sel);stroke-width:3}
.kernel.collapsed>rect.box{fill:#c9d6ee}
.mg>rect{fill:#fff;stroke:#aab;stroke-dasharray:none}
.mg>text{font-size:10px;fill:#556;cursor:pointer}
.mg.sel>rect{stroke:var(--sel);stroke-width:2.5}
.comp>rect{fill:none;stroke:#b46;stroke-dasharray:5 3;stroke-width:1.2}
.comp>text{font-size:10px;fill:#b46;cursor:pointer}
.comp.collapsed>rect{fill:#f7e3ec;fill-opacity:.95}
.pin rect{fill:#eee;stroke:#999;rx:9}
.pin text{font-size:10px;fill:#444}
.edge path.vis{fill:none;stroke-width:1.4}
.edge path.hit{fill:none;stroke:transparent;stroke-width:9;cursor:pointer}
.edge.fused path.vis{stroke:#3a3}
.edge.stitched path.vis{stroke:#36c}
.edge.separate path.vis{stroke:#d33;stroke-dasharray:4 3}
.edge.input path.vis{stroke:#aaa}
.edge.sel path.vis{stroke:var(--sel);stroke-width:3}
.edge text{font-size:9px;fill:#666;pointer-events:none}
.hidden{display:none}
svg.nolabels .edge text{display:none}
#legend{position:absolute;left:8px;bottom:8px;background:#fffc;border:1px solid var(--line);padding:4px 8px;font-size:11px}
#legend span.sw{display:inline-block;width:10px;height:10px;margin:0 3px 0 8px;vertical-align:middle;border:1px solid #555}
#detail{border:1px solid var(--line);background:#fff;padding:6px;margin-bottom:8px}
.bar{height:12px;background:#6a8fd0;display:inline-block;vertical-align:middle}
</style></head>
<body>
<header>
<h1>polyfuse report: <span id="title"></span></h1>
<span class="stat">primitives <b id="n-prims"></b></span>
<span class="stat">micrographs <b id="n-mgs"></b></span>
<span class="stat">kernels <b id="n-kernels"></b></span>
<span class="stat">edges <b id="n-decs"></b></span>
<span class="stat mut" id="bytes"></span>
<input id="search" type="search" placeholder="search ops, tensors, kernels…">
<button id="collapse-all">collapse kernels</button>
<button id="expand-all">expand all</button>
<button id="fit">fit</button>
</header>
<main>
<div id="graphwrap"><svg id="graph" xmlns="http://www.w3.org/2000/svg"><g id="viewport"></g></svg>
<div id="legend"></div></div>
<div id="side">
<div id="tabs">
<button data-v="decisions" class="on">Decisions</button><button data-v="micrograph">Micrograph</button><button data-v="kernel">Kernel</button><button data-v="profile">Compile profile</button>
</div>
<div id="v-decisions" class="view on"></div>
<div id="v-micrograph" class="view"><p class="mut">Click a primitive or a micrograph box.</p></div>
<div id="v-kernel" class="view"><p class="mut">Click a kernel (its title bar).</p></div>
<div id="v-profile" class="view"></div>
</div>
</main>
<script type="application/json" id="report-data">__DATA__</script>
<script>
"use strict";
(function(){
const D = JSON.parse(document.getElementById("report-data").textContent);
const L = D.layout;
const NS = "http://www.w3.org/2000/svg";
const KIND_COLORS = {elementwise:"#cfe8cf", broadcast:"#cde0f7", reduction:"#f9d9a8", opaque:"#e3d2f0", injective:"#f0e0c0"};
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s == null ? "" : s).replace(/[&<>"]/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;"}[c]));
const el = (tag, attrs, parent) => { const e = document.createElementNS(NS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; };
const fmtB = (n) => n == null ? "?" : n >= 1048576 ? (n/1048576).toFixed(2)+" MiB" : n >= 1024 ? (n/1024).toFixed(1)+" KiB" : n+" B";
const fmtS = (s) => s >= 1e-3 ? (s*1e3).toFixed(3)+" ms" : s >= 1e-6 ? (s*1e6).toFixed(2)+" µs" : (s*1e9).toFixed(1)+" ns";
const kindPills = (ks) => ks.map((k) => `<span class="pill k-${k.replace(/ /g,"-")}">${esc(k)}</span>`).join("");
const primById = {}; D.prims.forEach((p) => primById[p.id] = p);
const mgById = {}; D.micrographs.forEach((m) => mgById[m.id] = m);
const kById = {}; D.kernels.forEach((k) => kById[k.id] = k);

$("title").textContent = D.name + " (" + D.arch + ")";
$("n-prims").textContent = D.counts.primitives;
$("n-mgs").textContent = D.counts.micrographs;
$("n-kernels").textContent = D.counts.kernels;
$("n-decs").textContent = D.counts.decisions;
$("bytes").textContent = "global bytes " + fmtB(D.bytes.global) + " / compulsory " + fmtB(D.bytes.compulsory);
$("legend").innerHTML = Object.keys(KIND_COLORS).map((k) => `<span class="sw" style="background:${KIND_COLORS[k]}"></span>${k}`).join("") +
  '<br><span class="sw" style="background:#3a3"></span>fused <span class="sw" style="background:#36c"></span>stitched <span class="sw" style="background:#d33"></span>not fused (click for why) <span class="sw" style="border:1px dashed #b46"></span>composite';

// ------------------------------------------------------------------ graph drawing
const svg = $("graph"), vp = $("viewport");
const gK = el("g", {id:"layer-kernels"}, vp), gC = el("g", {id:"layer-comps"}, vp), gE = el("g", {id:"layer-edges"}, vp), gN = el("g", {id:"layer-nodes"}, vp);
const kernelG = {}, mgG = {}, nodeG = {}, compG = {}, edgeG = [], pinG = [];
const collapsedK = new Set(), collapsedC = new Set();

D.kernels.forEach((k) => {
  const b = L.kernels[k.id];
  const g = el("g", {"class":"kernel", "data-id":k.id}, gK);
  el("rect", {"class":"box", x:b[0], y:b[1], width:b[2], height:b[3], rx:6}, g);
  const t = el("text", {x:b[0]+8, y:b[1]+15}, g);
  t.textContent = "▾ " + k.id + "  grid " + k.grid[0] + " × block " + k.block[0];
  t.addEventListener("click", (ev) => { ev.stopPropagation(); if (ev.offsetX !== undefined && ev.shiftKey) { toggleKernel(k.id); } else { showKernel(k.id); } });
  t.addEventListener("dblclick", (ev) => { ev.stopPropagation(); toggleKernel(k.id); });
  kernelG[k.id] = g;
  k.micrographs.forEach((m) => {
    const mb = L.micrographs[m];
    const mg = el("g", {"class":"mg", "data-id":m}, g);
    el("rect", {x:mb[0], y:mb[1], width:mb[2], height:mb[3], rx:4}, mg);
    const mt = el("text", {x:mb[0]+5, y:mb[1]+12}, mg);
    const info = mgById[m];
    mt.textContent = m + " (" + info.kind + ")" + (info.canonical ? "  " + info.canonical : "");
    mt.addEventListener("click", (ev) => { ev.stopPropagation(); showMicrograph(m); });
    mgG[m] = mg;
  });
});
D.composites.forEach((c) => {
  const b = L.composites[c.id];
  const g = el("g", {"class":"comp", "data-id":c.id}, gC);
  el("rect", {x:b[0], y:b[1], width:b[2], height:b[3], rx:5}, g);
  const t = el("text", {x:b[0]+b[2]-4, y:b[1]-2, "text-anchor":"end"}, g);
  t.textContent = c.tag;
  t.addEventListener("click", (ev) => { ev.stopPropagation(); toggleComp(c.id); });
  compG[c.id] = g;
});
L.pins.forEach((p) => {
  const g = el("g", {"class":"pin", "data-id":p.id, "data-kernel":p.kernel}, gN);
  const b = p.box;
  el("rect", {x:b[0], y:b[1], width:b[2], height:b[3]}, g);
  const t = el("text", {x:b[0]+7, y:b[1]+14}, g);
  const inp = D.inputs.find((i) => i.id === p.id);
  t.textContent = (inp && inp.constant ? "◆ " : "▸ ") + p.id;
  el("title", {}, g).textContent = p.id + " " + JSON.stringify(inp ? inp.shape : []) + (inp && inp.constant ? " (constant)" : " (graph input)");
  pinG.push({g:g, pin:p});
});
D.prims.forEach((p) => {
  const b = L.nodes[p.id];
  const g = el("g", {"class":"node" + (p.output ? " out" : ""), "data-id":p.id, "data-kind":p.kind}, gN);
  el("rect", {x:b[0], y:b[1], width:b[2], height:b[3], fill:KIND_COLORS[p.kind] || "#ddd"}, g);
  const t = el("text", {x:b[0]+6, y:b[1]+13}, g);
  t.textContent = p.id.length > 24 ? p.id.slice(0, 23) + "…" : p.id;
  const t2 = el("text", {x:b[0]+6, y:b[1]+25, fill:"#555"}, g);
  t2.textContent = p.kind + " " + JSON.stringify(p.shape) + (p.output ? " → output" : "");
  el("title", {}, g).textContent = p.text;
  g.addEventListener("click", (ev) => { ev.stopPropagation(); selectPrim(p.id); });
  nodeG[p.id] = g;
});
function bottom(b){ return [b[0]+b[2]/2, b[1]+b[3]]; }
function top(b){ return [b[0]+b[2]/2, b[1]]; }
function curve(a, c){ const dy = Math.max(20, (c[1]-a[1])/2); return `M${a[0]},${a[1]} C${a[0]},${a[1]+dy} ${c[0]},${c[1]-dy} ${c[0]},${c[1]}`; }
function addEdge(src, dst, cls, label, dec){
  const g = el("g", {"class":"edge " + cls}, gE);
  const d = curve(bottom(src), top(dst));
  el("path", {"class":"vis", d:d}, g);
  const hit = el("path", {"class":"hit", d:d}, g);
  const m = [(src[0]+src[2]/2 + dst[0]+dst[2]/2)/2, (src[1]+src[3]+dst[1])/2];
  const t = el("text", {x:m[0]+3, y:m[1]}, g); t.textContent = label;
  if (dec) { g.setAttribute("data-dec", dec.id); g.setAttribute("data-outcome", dec.outcome); hit.addEventListener("click", (ev) => { ev.stopPropagation(); selectDecision(dec.id, true); }); el("title", {}, g).textContent = dec.summary; }
  return g;
}
D.decisions.forEach((d) => {
  const g = addEdge(L.nodes[d.producer], L.nodes[d.consumer], d.outcome, d.tensor + " " + JSON.stringify(d.shape), d);
  edgeG.push({g:g, src:d.producer, dst:d.consumer, dec:d});
});
D.input_edges.forEach((e) => {
  const k = primById[e.dst].kernel;
  const pin = L.pins.find((p) => p.id === e.src && p.kernel === k);
  if (!pin) return;
  const g = addEdge(pin.box, L.nodes[e.dst], "input", "", null);
  edgeG.push({g:g, src:"pin:" + e.src + "@" + k, dst:e.dst, dec:null, kernel:k});
});

// ------------------------------------------------------------------ collapse / expand
function refreshVisibility(){
  D.prims.forEach((p) => {
    const hide = collapsedK.has(p.kernel) || (p.comp && collapsedC.has(p.comp));
    nodeG[p.id].classList.toggle("hidden", hide);
  });
  D.kernels.forEach((k) => {
    const c = collapsedK.has(k.id);
    kernelG[k.id].classList.toggle("collapsed", c);
    k.micrographs.forEach((m) => mgG[m].classList.toggle("hidden", c));
    const t = kernelG[k.id].querySelector("text");
    t.textContent = (c ? "▸ " : "▾ ") + k.id + "  grid " + k.grid[0] + " × block " + k.block[0] + (c ? "  [" + k.micrographs.join(", ") + "]" : "");
  });
  pinG.forEach((p) => p.g.classList.toggle("hidden", collapsedK.has(p.pin.kernel)));
  D.composites.forEach((c) => {
    const anyK = c.prims.some((p) => collapsedK.has(primById[p].kernel));
    compG[c.id].classList.toggle("hidden", anyK);
    compG[c.id].classList.toggle("collapsed", collapsedC.has(c.id));
  });
  edgeG.forEach((e) => {
    const hiddenNode = (id) => id.startsWith("pin:") ? collapsedK.has(e.kernel) : nodeG[id].classList.contains("hidden");
    const sameBox = e.dec && ((collapsedK.has(primById[e.src].kernel) && primById[e.src].kernel === primById[e.dst].kernel) ||
      (primById[e.src].comp && primById[e.src].comp === primById[e.dst].comp && collapsedC.has(primById[e.src].comp)));
    e.g.classList.toggle("hidden", (!e.dec && hiddenNode(e.src)) || sameBox || (!e.dec && hiddenNode(e.dst)));
  });
}
function toggleKernel(id){ collapsedK.has(id) ? collapsedK.delete(id) : collapsedK.add(id); refreshVisibility(); }
function toggleComp(id){ collapsedC.has(id) ? collapsedC.delete(id) : collapsedC.add(id); refreshVisibility(); }
$("collapse-all").addEventListener("click", () => { D.kernels.forEach((k) => collapsedK.add(k.id)); refreshVisibility(); });
$("expand-all").addEventListener("click", () => { collapsedK.clear(); collapsedC.clear(); refreshVisibility(); });

// ------------------------------------------------------------------ pan / zoom
let view = {x:0, y:0, s:1};
function apply(){ vp.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.s})`); svg.classList.toggle("nolabels", view.s < 0.8); }
function fit(){
  const r = svg.getBoundingClientRect();
  const s = Math.min((r.width || 800) / L.width, (r.height || 600) / L.height, 1.2);
  const sw = Math.max(s, Math.min(1, (r.width || 800) / L.width));
  view = {s:sw, x:((r.width || 800) - L.width*sw)/2, y:10}; apply();
}
function centerOn(b){
  const r = svg.getBoundingClientRect();
  view.s = Math.max(view.s, 0.9);
  view.x = r.width/2 - (b[0]+b[2]/2)*view.s; view.y = r.height/2 - (b[1]+b[3]/2)*view.s; apply();
}
let drag = null;
svg.addEventListener("mousedown", (ev) => { drag = {x:ev.clientX, y:ev.clientY, vx:view.x, vy:view.y, moved:false}; svg.style.cursor = "grabbing"; });
window.addEventListener("mousemove", (ev) => { if (!drag) return; const dx = ev.clientX-drag.x, dy = ev.clientY-drag.y; if (Math.abs(dx)+Math.abs(dy) > 2) drag.moved = true; view.x = drag.vx+dx; view.y = drag.vy+dy; apply(); });
window.addEventListener("mouseup", () => { drag = null; svg.style.cursor = "grab"; });
svg.addEventListener("wheel", (ev) => {
  ev.preventDefault();
  const r = svg.getBoundingClientRect(), mx = ev.clientX - r.left, my = ev.clientY - r.top;
  const f = Math.exp(-ev.deltaY * 0.0015), s = Math.min(4, Math.max(0.02, view.s * f));
  view.x = mx - (mx - view.x) * s / view.s; view.y = my - (my - view.y) * s / view.s; view.s = s; apply();
}, {passive:false});
$("fit").addEventListener("click", fit);

// ------------------------------------------------------------------ selection and views
function tab(name){
  document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("on", b.dataset.v === name));
  document.querySelectorAll(".view").forEach((v) => v.classList.toggle("on", v.id === "v-" + name));
}
document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => tab(b.dataset.v)));
function clearSel(){ document.querySelectorAll(".sel").forEach((e) => e.classList.remove("sel")); }

function decisionRows(list){
  return "<table><tr><th>edge</th><th>tensor</th><th>outcome</th><th>kinds</th></tr>" + list.map((d) =>
    `<tr class="dec" data-dec="${d.id}"><td>${esc(d.producer)} → ${esc(d.consumer)}</td><td>${esc(d.tensor)} <span class="mut">${esc(JSON.stringify(d.shape))}</span></td><td>${esc(d.outcome)}</td><td>${kindPills(d.kinds)}</td></tr>`).join("") + "</table>";
}
function decisionDetail(d){
  let h = `<div id="detail" data-dec="${d.id}"><b>${esc(d.producer)} → ${esc(d.consumer)}</b> [${esc(d.tensor)} ${esc(JSON.stringify(d.shape))}] ${kindPills(d.kinds)}`;
  h += `<div class="reason"><b>${esc(d.outcome)}</b>: ${esc(d.summary)}</div>`;
  h += `<div>partition (Layer 1): ${d.partition.fused ? "fused" : "not fused"}${d.partition.rule ? " (rule " + d.partition.rule + ")" : ""}: ${esc(d.partition.reason)}</div>`;
  if (d.stitch) h += `<div>stitch (Layer 2): rule ${d.stitch.rule}: ${esc(d.stitch.text)}</div>`;
  d.refusals.forEach((s) => { h += `<div>stitch refused: ${esc(s.text)}</div>`; });
  if (d.placement) h += `<div>intermediate lives in: <b>${esc(d.placement.space)}</b> (${esc(d.placement.reason)})${d.placement.bytes ? ", footprint " + fmtB(d.placement.bytes) : ""}</div>`;
  d.notes.forEach((n) => { h += `<div class="mut">${esc(n)}</div>`; });
  h += `<div class="mut">micrographs ${esc(d.mg_producer)} → ${esc(d.mg_consumer)}; kernels ${esc(d.kernel_producer)} → ${esc(d.kernel_consumer)}</div></div>`;
  return h;
}
function renderDecisions(filter){
  const v = $("v-decisions");
  const counts = {}; D.decisions.concat(D.packs || [], D.launch_layouts || []).forEach((d) => d.kinds.forEach((k) => counts[k] = (counts[k]||0)+1));
  let h = `<div id="detail-slot"></div><div>filter: <select id="kind-filter"><option value="">all (${D.decisions.length})</option>` +
    D.reason_kinds.map((k) => `<option value="${k}"${filter===k?" selected":""}>${k} (${counts[k]||0})</option>`).join("") + "</select></div>";
  const list = filter ? D.decisions.filter((d) => d.kinds.includes(filter)) : D.decisions;
  h += decisionRows(list);
  if (D.feedback.length) h += "<h3>isl feedback events</h3>" + D.feedback.map((f) => `<pre class="wrap">${esc(f.text)}</pre>`).join("");
  if (D.cost_model.length) h += "<h3>cost model decisions</h3>" + D.cost_model.map((c) => `<div>${esc(c.kernel)}: ${esc(c.note)}</div>`).join("");
  h += "<h3>memory stitching (Layer 2)</h3>" + (D.stitches.map((s) => `<div>${kindPills(s.kinds)} ${esc(s.text)}</div>`).join("") || '<span class="mut">none</span>');
  const packs = (D.packs || []).filter((p) => !filter || p.kinds.includes(filter));
  h += '<h3>parallel stitching (Layer 3)</h3><div id="packs">' + (packs.map((p) => `<div class="pack">${kindPills(p.kinds)} ${esc(p.text)}</div>`).join("") || '<span class="mut">none</span>') + "</div>";
  const lays = (D.launch_layouts || []).filter((p) => !filter || p.kinds.includes(filter));
  h += '<h3>launch layouts (reduction layouts, elements per thread, reduction splits)</h3><div id="layouts">' + (lays.map((p) => `<div class="pack">${kindPills(p.kinds)} ${esc(p.kernel ? p.kernel + ": " : "")}${esc(p.text)}</div>`).join("") || '<span class="mut">none</span>') + "</div>";
  v.innerHTML = h;
  $("kind-filter").addEventListener("change", (ev) => renderDecisions(ev.target.value));
  v.querySelectorAll("tr.dec").forEach((tr) => tr.addEventListener("click", () => selectDecision(+tr.dataset.dec, false)));
}
function selectDecision(id, fromGraph){
  const d = D.decisions[id];
  tab("decisions");
  clearSel();
  const e = edgeG.find((x) => x.dec && x.dec.id === id);
  if (e) e.g.classList.add("sel");
  $("detail-slot").innerHTML = decisionDetail(d);
  const tr = document.querySelector(`tr.dec[data-dec="${id}"]`);
  if (tr) { tr.classList.add("sel"); }
  if (!fromGraph && e) { collapsedK.delete(primById[d.producer].kernel); collapsedK.delete(primById[d.consumer].kernel); refreshVisibility(); centerOn(L.nodes[d.producer]); }
  $("v-decisions").scrollTop = 0;
}
function selectPrim(id){
  clearSel();
  nodeG[id].classList.add("sel");
  showMicrograph(primById[id].mg, id);
}
function showMicrograph(m, prim){
  const g = mgById[m];
  if (!prim) { clearSel(); }
  mgG[m].classList.add("sel");
  let h = "";
  if (prim) {
    const p = primById[prim];
    h += `<h2>primitive ${esc(prim)}</h2><pre class="wrap">${esc(p.text)}</pre>`;
    h += "<h3>its edges</h3>" + decisionRows(D.decisions.filter((d) => d.producer === prim || d.consumer === prim));
  }
  h += `<h2>micrograph ${esc(m)} (${esc(g.kind)}) in kernel <a href="#" id="mg-kernel">${esc(g.kernel)}</a></h2>`;
  h += `<div>primitives: ${g.prims.map(esc).join(", ")}</div>`;
  if (g.canonical) h += `<div>reduction canonical form: <b>${esc(g.canonical)}</b></div>`;
  if (g.budget_used != null) h += `<div>isl scheduler operations used: ${g.budget_used}</div>`;
  g.notes.forEach((n) => { h += `<div class="mut">note: ${esc(n)}</div>`; });
  h += "<h3>feedback events</h3>" + (g.feedback.length ? g.feedback.map((f) => `<pre class="wrap">${esc(f)}</pre>`).join("") : '<span class="mut">none</span>');
  h += "<h3>statements</h3>" + g.statements.map((s) => `<div><b>${esc(s.name)}</b> (${esc(s.role)} of ${esc(s.prim)})</div>`).join("");
  h += `<h3>isl domain</h3><pre class="wrap">${esc(g.domain)}</pre>`;
  h += `<h3>access relations: writes</h3><pre class="wrap">${esc(g.writes)}</pre><h3>reads</h3><pre class="wrap">${esc(g.reads)}</pre>`;
  h += `<h3>dependences: flow</h3><pre class="wrap">${esc(g.flow)}</pre><h3>validity</h3><pre class="wrap">${esc(g.validity)}</pre>`;
  h += `<h3>schedule tree (isl scheduler, before mapping)</h3><pre class="wrap">${esc(g.schedule)}</pre>`;
  h += `<h3>schedule tree after tiling/mapping (kernel ${esc(g.kernel)})</h3><pre class="wrap">${esc(g.mapped_schedule)}</pre>`;
  const k = kById[g.kernel];
  if (k) h += `<h3>isl AST (kernel ${esc(k.id)})</h3><pre>${esc(k.ast)}</pre>`;
  $("v-micrograph").innerHTML = h;
  $("v-micrograph").querySelectorAll("tr.dec").forEach((tr) => tr.addEventListener("click", () => selectDecision(+tr.dataset.dec, false)));
  const a = $("mg-kernel"); if (a) a.addEventListener("click", (ev) => { ev.preventDefault(); showKernel(g.kernel, m); });
  tab("micrograph"); $("v-micrograph").scrollTop = 0;
}
const PART_COLORS = ["#3a8", "#36c", "#c63", "#a3a", "#aa3", "#3aa", "#c36"];
function showKernel(id, hlMg){
  const k = kById[id];
  clearSel();
  kernelG[id].classList.add("sel");
  const md = k.modelled;
  let h = `<h2 id="kernel-title">kernel ${esc(k.id)}</h2>`;
  h += `<div>micrographs: ${k.micrographs.map((m, i) => `<a href="#" class="mglink" data-mg="${m}" style="color:${PART_COLORS[i % PART_COLORS.length]}">${m}</a>`).join(", ")}</div>`;
  h += `<table><tr><td>grid × block</td><td>${k.grid.join("×")} blocks ${esc(JSON.stringify(k.grid_dims))} × ${k.block.join("×")} threads ${esc(JSON.stringify(k.tile_sizes))}</td></tr>`;
  h += `<tr><td>shared memory</td><td>${fmtB(k.shared_bytes)} per block (kernel facts: static + dynamic)${k.static_shared_bytes != null ? "; " + fmtB(k.static_shared_bytes) + " reported by the CUDA compiler" : ""}</td></tr>`;
  h += `<tr><td>registers</td><td>${k.registers != null ? k.registers + " per thread (CUDA compiler)" + (k.spill_stores ? ", " + k.spill_stores + " B spills" : "") : "not compiled (no NVRTC/nvcc)"}</td></tr>`;
  h += `<tr><td>global bytes</td><td>read ${fmtB(k.bytes_read)} + written ${fmtB(k.bytes_written)} (isl footprint) vs compulsory ${fmtB(k.compulsory_bytes)} (each parameter once)</td></tr>`;
  h += `<tr><td>modelled time</td><td><b>${fmtS(md.total_s)}</b> (modelled, ${esc(md.device)}): memory ${fmtS(md.memory_s)}, compute ${fmtS(md.compute_s)}, launch ${fmtS(md.launch_s)} → <b>${md.bound}-bound</b> (modelled)</td></tr>`;
  if (k.strategy) h += `<tr><td>reduction strategy</td><td>${esc(k.strategy)}</td></tr>`;
  h += "</table><h3>placements</h3><table>" + k.placements.map((p) => `<tr><td>${esc(p.tensor)}</td><td><b>${esc(p.space)}</b></td><td>${esc(p.reason)}${p.bytes ? " (" + fmtB(p.bytes) + ")" : ""}</td></tr>`).join("") + "</table>";
  if (k.notes.length) h += "<h3>notes</h3>" + k.notes.map((n) => `<div>${esc(n)}</div>`).join("");
  const lines = k.source.split("\n");
  const partOf = new Array(lines.length).fill(-1);
  k.parts.forEach((p, i) => { for (let j = p.start; j <= p.end && j < lines.length; j++) partOf[j] = i; });
  h += '<h3>CUDA source</h3><pre class="src" id="kernel-source">' + lines.map((ln, j) => {
    const pi = partOf[j];
    if (pi < 0) return `<span class="ln">${esc(ln) || " "}</span>`;
    const p = k.parts[pi];
    return `<span class="ln part${p.mg === hlMg ? " hl" : ""}" data-mg="${p.mg}" style="border-left-color:${PART_COLORS[k.micrographs.indexOf(p.mg) % PART_COLORS.length]}">${esc(ln) || " "}</span>`;
  }).join("") + "</pre>";
  h += `<h3>isl AST</h3><pre>${esc(k.ast)}</pre><h3>mapped schedule tree</h3><pre class="wrap">${esc(k.schedule)}</pre>`;
  $("v-kernel").innerHTML = h;
  $("v-kernel").querySelectorAll("a.mglink").forEach((a) => a.addEventListener("click", (ev) => {
    ev.preventDefault();
    $("v-kernel").querySelectorAll(".ln.part").forEach((s) => s.classList.toggle("hl", s.dataset.mg === a.dataset.mg));
  }));
  tab("kernel"); $("v-kernel").scrollTop = 0;
}
function renderProfile(){
  const st = D.profile.stages, mx = Math.max(1e-9, ...Object.values(st));
  let h = `<h2>compile seconds per stage</h2><table>` + Object.keys(st).map((k) => `<tr><td>${esc(k)}</td><td>${st[k].toFixed(3)} s</td><td><span class="bar" style="width:${Math.round(200*st[k]/mx)}px"></span></td></tr>`).join("") +
    `<tr><td><b>total</b></td><td><b>${D.profile.total.toFixed(3)} s</b></td><td></td></tr></table>`;
  const pb = D.profile.per_micrograph_budget;
  if (Object.keys(pb).length) h += "<h3>isl scheduler operations per micrograph</h3><table>" + Object.keys(pb).map((m) => `<tr><td>${m}</td><td>${pb[m]}</td></tr>`).join("") + "</table>";
  h += "<h3>modelled kernel times (modelled, " + esc(D.device.name) + ")</h3><table><tr><th>kernel</th><th>modelled</th><th>bound</th><th>bytes</th></tr>" +
    D.kernels.map((k) => `<tr><td>${esc(k.id)}</td><td>${fmtS(k.modelled.total_s)}</td><td>${k.modelled.bound}</td><td>${fmtB(k.bytes_read + k.bytes_written)}</td></tr>`).join("") + "</table>";
  if (D.rewrites.length) h += "<h3>graph rewrites</h3>" + D.rewrites.map((r) => `<div>${esc(r)}</div>`).join("");
  $("v-profile").innerHTML = h;
}

// ------------------------------------------------------------------ search
$("search").addEventListener("input", (ev) => {
  const q = ev.target.value.trim().toLowerCase();
  document.querySelectorAll(".match").forEach((e) => e.classList.remove("match"));
  if (!q) return;
  let first = null;
  D.prims.forEach((p) => {
    if ((p.id + " " + p.composite + " " + p.kind + " " + p.kernel + " " + p.mg).toLowerCase().includes(q)) {
      nodeG[p.id].classList.add("match"); if (!first) first = p;
    }
  });
  if (first) { if (collapsedK.has(first.kernel)) { collapsedK.delete(first.kernel); refreshVisibility(); } centerOn(L.nodes[first.id]); }
});

svg.addEventListener("click", () => { if (!drag) clearSel(); });
renderDecisions("");
renderProfile();
apply();
fit();
// deep links: report.html#kernel=NAME, #edge=N, #mg=mgN, #op=NAME
const h = decodeURIComponent(location.hash.slice(1)), eq = h.indexOf("=");
if (eq > 0) {
  const key = h.slice(0, eq), val = h.slice(eq + 1);
  if (key === "kernel" && kById[val]) showKernel(val);
  else if (key === "edge" && D.decisions[+val]) selectDecision(+val, false);
  else if (key === "mg" && mgById[val]) showMicrograph(val);
  else if (key === "op" && primById[val]) selectPrim(val);
}
window.__polyfuseReady = true;
})();
</script></body></html>
"""
