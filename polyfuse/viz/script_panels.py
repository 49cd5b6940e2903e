# ruff: noqa: E501  (JavaScript inside a string)
"""The report page's side panels, selection, search and deep links.

Runs after :mod:`polyfuse.viz.script_graph` in the same function scope. Every decision text is
shown as the plan wrote it, with the plain-language line :mod:`polyfuse.viz.plain` wrote beside
it. Deep links (``#kernel=NAME``, ``#mg=mgN``, ``#op=NAME``, ``#edge=N``) are followed on load
and on every ``hashchange``: the target is unfolded, selected and scrolled to; selecting
something writes its link into the address bar (``history.replaceState``, no new event).
"""

SCRIPT_PANELS = r"""
// ------------------------------------------------------------------ selection and views
function tab(name){
  document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("on", b.dataset.v === name));
  document.querySelectorAll(".view").forEach((v) => v.classList.toggle("on", v.id === "v-" + name));
}
document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => tab(b.dataset.v)));
function clearSel(){ document.querySelectorAll(".sel").forEach((e) => e.classList.remove("sel")); }
function setHash(h){ try { history.replaceState(null, "", "#" + h); } catch (e) { /* file: pages may refuse */ } }
const plain = (s) => s ? `<div class="plain">${esc(s)}</div>` : "";
const stage = (s) => `<span class="stage">${esc(s)}</span> `;

function decisionRows(list){
  return list.map((d) =>
    `<div class="dec" data-dec="${d.id}"><b>${esc(d.producer)} → ${esc(d.consumer)}</b> <span class="mut">${esc(d.tensor)} ${esc(JSON.stringify(d.shape))}</span> <span class="o-${d.outcome}">${esc(d.outcome)}</span> ${kindPills(d.kinds)}${plain(d.plain)}</div>`).join("");
}
function decisionDetail(d){
  let h = `<div id="detail" data-dec="${d.id}"><b>${esc(d.producer)} → ${esc(d.consumer)}</b> [${esc(d.tensor)} ${esc(JSON.stringify(d.shape))}] ${kindPills(d.kinds)}`;
  h += `<div class="reason"><b>${esc(d.outcome)}</b>: ${esc(d.summary)}</div>`;
  h += `<div class="item">${stage("partition (Layer 1)")}${d.partition.fused ? "fused" : "not fused"}${d.partition.rule ? " (rule " + d.partition.rule + ")" : ""}: ${esc(d.partition.reason)}${plain(d.partition.plain)}</div>`;
  if (d.stitch) h += `<div class="item">${stage("stitch (Layer 2)")}rule ${d.stitch.rule}: ${esc(d.stitch.text)}${plain(d.stitch.plain)}</div>`;
  d.refusals.forEach((s) => { h += `<div class="item">${stage("stitch refused (Layer 2)")}${esc(s.text)}${plain(s.plain)}</div>`; });
  if (d.placement) h += `<div class="item">${stage("intermediate")}lives in <b>${esc(d.placement.space)}</b> (${esc(d.placement.reason)})${d.placement.bytes ? ", footprint " + fmtB(d.placement.bytes) : ""}${plain(d.placement.plain)}</div>`;
  d.notes.forEach((n) => { h += `<div class="mut">${esc(n)}</div>`; });
  h += `<div class="mut">micrographs ${esc(d.mg_producer)} → ${esc(d.mg_consumer)}; kernels ${esc(d.kernel_producer)} → ${esc(d.kernel_consumer)}</div></div>`;
  return h;
}
const item = (kinds, head, text, pl) => `<div class="item pack">${kindPills(kinds)} ${esc(head)}${esc(text)}${plain(pl)}</div>`;
function renderDecisions(filter){
  const v = $("v-decisions");
  const counts = {}; D.decisions.concat(D.packs, D.launch_layouts).forEach((d) => d.kinds.forEach((k) => counts[k] = (counts[k] || 0) + 1));
  let h = `<div id="detail-slot"></div><div>filter: <select id="kind-filter"><option value="">all (${D.decisions.length})</option>` +
    D.reason_kinds.map((k) => `<option value="${k}"${filter === k ? " selected" : ""}>${k} (${counts[k] || 0})</option>`).join("") + "</select></div>";
  const has = (d) => !filter || d.kinds.includes(filter);
  h += '<h3>producer → consumer edges</h3><div id="dec-list">' + decisionRows(D.decisions.filter(has)) + "</div>";
  if (D.feedback.length) h += "<h3>isl feedback events</h3>" + D.feedback.map((f) => `<div class="item"><pre class="wrap">${esc(f.text)}</pre>${plain(f.plain)}</div>`).join("");
  const cost = D.cost_model.filter((c) => !filter || c.kinds.includes(filter));
  if (cost.length) h += "<h3>cost model decisions</h3>" + cost.map((c) => item(c.kinds, c.kernel ? c.kernel + ": " : "", c.note, c.plain)).join("");
  const st = D.stitches.filter(has);
  h += '<h3>memory stitching (Layer 2)</h3><div id="stitches">' + (st.map((s) => item(s.kinds, "", s.text, s.plain)).join("") || '<span class="mut">none</span>') + "</div>";
  const packs = D.packs.filter(has);
  h += '<h3>parallel stitching (Layer 3)</h3><div id="packs">' + (packs.map((p) => item(p.kinds, "", p.text, p.plain)).join("") || '<span class="mut">none</span>') + "</div>";
  const lays = D.launch_layouts.filter(has);
  h += '<h3>launch layouts (reduction layouts, elements per thread, reduction splits, GEMM tiles)</h3><div id="layouts">' + (lays.map((p) => item(p.kinds, p.kernel ? p.kernel + ": " : "", p.text, p.plain)).join("") || '<span class="mut">none</span>') + "</div>";
  v.innerHTML = h;
  $("kind-filter").addEventListener("change", (ev) => renderDecisions(ev.target.value));
  v.querySelectorAll(".dec").forEach((r) => r.addEventListener("click", () => selectDecision(+r.dataset.dec, false)));
}
function selectDecision(id, fromGraph){
  const d = D.decisions[id];
  tab("decisions");
  clearSel();
  if (!fromGraph) { reveal(d.kernel_producer); reveal(d.kernel_consumer); }
  const e = edgeG.find((x) => x.dec && x.dec.id === id);
  if (e) e.g.classList.add("sel");
  $("detail-slot").innerHTML = decisionDetail(d);
  const row = document.querySelector(`.dec[data-dec="${id}"]`);
  if (row) row.classList.add("sel");
  if (!fromGraph) centerOn(boxNow(L.nodes[d.producer], d.kernel_producer));
  $("v-decisions").scrollTop = 0;
  setHash("edge=" + id);
}
function selectPrim(id){
  const p = primById[id];
  reveal(p.kernel);
  clearSel();
  nodeG[id].classList.add("sel");
  showMicrograph(p.mg, id);
  setHash("op=" + id);
}
function showMicrograph(m, prim){
  const g = mgById[m];
  if (!prim) { reveal(g.kernel); clearSel(); setHash("mg=" + m); }
  mgG[m].classList.add("sel");
  let h = "";
  if (prim) {
    const p = primById[prim];
    h += `<h2>primitive ${esc(prim)}</h2><pre class="wrap">${esc(p.text)}</pre>`;
    h += "<h3>its edges</h3>" + decisionRows(D.decisions.filter((d) => d.producer === prim || d.consumer === prim));
  }
  h += `<h2 id="mg-title">micrograph ${esc(m)} (${esc(g.kind)}) in kernel <a href="#" id="mg-kernel">${esc(g.kernel)}</a></h2>`;
  h += `<div>primitives: ${g.prims.map(esc).join(", ")}</div>`;
  if (g.canonical) h += `<div>reduction canonical form: <b>${esc(g.canonical)}</b></div>`;
  if (g.budget_used != null) h += `<div>isl scheduler operations used: ${g.budget_used}</div>`;
  g.notes.forEach((n) => { h += `<div class="mut">note: ${esc(n)}</div>`; });
  const fb = D.feedback.filter((f) => f.micrograph === m || g.feedback.includes(f.text));
  h += "<h3>feedback events</h3>" + (fb.length ? fb.map((f) => `<div class="item"><pre class="wrap">${esc(f.text)}</pre>${plain(f.plain)}</div>`).join("") : '<span class="mut">none</span>');
  h += "<h3>statements</h3>" + g.statements.map((s) => `<div><b>${esc(s.name)}</b> (${esc(s.role)} of ${esc(s.prim)})</div>`).join("");
  h += `<h3>isl domain</h3><pre class="wrap">${esc(g.domain)}</pre>`;
  h += `<h3>access relations: writes</h3><pre class="wrap">${esc(g.writes)}</pre><h3>reads</h3><pre class="wrap">${esc(g.reads)}</pre>`;
  h += `<h3>dependences: flow</h3><pre class="wrap">${esc(g.flow)}</pre><h3>validity</h3><pre class="wrap">${esc(g.validity)}</pre>`;
  h += `<h3>schedule tree (isl scheduler, before mapping)</h3><pre class="wrap">${esc(g.schedule)}</pre>`;
  h += `<h3>schedule tree after tiling/mapping (kernel ${esc(g.kernel)})</h3><pre class="wrap">${esc(g.mapped_schedule)}</pre>`;
  const k = kById[g.kernel];
  if (k) h += `<h3>isl AST (kernel ${esc(k.id)})</h3><pre>${esc(k.ast)}</pre>`;
  $("v-micrograph").innerHTML = h;
  $("v-micrograph").querySelectorAll(".dec").forEach((r) => r.addEventListener("click", () => selectDecision(+r.dataset.dec, false)));
  const a = $("mg-kernel"); if (a) a.addEventListener("click", (ev) => { ev.preventDefault(); showKernel(g.kernel, m); });
  tab("micrograph"); $("v-micrograph").scrollTop = 0;
}
const PART_COLORS = ["#3a8", "#36c", "#c63", "#a3a", "#aa3", "#3aa", "#c36"];
function showKernel(id, hlMg){
  const k = kById[id];
  reveal(id);
  clearSel();
  kernelG[id].classList.add("sel");
  if (chipG[id]) chipG[id].classList.add("sel");
  setHash("kernel=" + id);
  const md = k.modelled;
  let h = `<h2 id="kernel-title">kernel ${esc(k.id)}</h2>`;
  const seg = segOf[id];
  if (seg.repeat !== null) h += `<div class="mut">in ${esc(segName(seg))} (a repeated block of ${seg.kernels.length} kernels)</div>`;
  else if (seg.foldable) h += `<div class="mut">in ${esc(segName(seg))} (${seg.kernels.length} kernels between repeated blocks)</div>`;
  h += `<div>micrographs: ${k.micrographs.map((m, i) => `<a href="#" class="mglink" data-mg="${m}" style="color:${PART_COLORS[i % PART_COLORS.length]}">${m}</a>`).join(", ")}</div>`;
  h += `<table><tr><td>grid × block</td><td>${k.grid.join("×")} blocks ${esc(JSON.stringify(k.grid_dims))} × ${k.block.join("×")} threads ${esc(JSON.stringify(k.tile_sizes))}</td></tr>`;
  h += `<tr><td>shared memory</td><td>${fmtB(k.shared_bytes)} per block (kernel facts: static + dynamic)${k.static_shared_bytes != null ? "; " + fmtB(k.static_shared_bytes) + " reported by the CUDA compiler" : ""}</td></tr>`;
  h += `<tr><td>registers</td><td>${k.registers != null ? k.registers + " per thread (CUDA compiler)" + (k.spill_stores ? ", " + k.spill_stores + " B spills" : "") : "not compiled (no NVRTC/nvcc)"}</td></tr>`;
  h += `<tr><td>global bytes</td><td>read ${fmtB(k.bytes_read)} + written ${fmtB(k.bytes_written)} (isl footprint) vs compulsory ${fmtB(k.compulsory_bytes)} (each parameter once)</td></tr>`;
  h += `<tr><td>modelled time</td><td><b>${fmtS(md.total_s)}</b> (modelled, ${esc(md.device)}): memory ${fmtS(md.memory_s)}, compute ${fmtS(md.compute_s)}, launch ${fmtS(md.launch_s)} → <b>${md.bound}-bound</b> (modelled)</td></tr>`;
  if (k.strategy) h += `<tr><td>reduction strategy</td><td>${esc(k.strategy)}</td></tr>`;
  h += "</table>";
  const lays = D.launch_layouts.filter((p) => p.kernel === id);
  const packs = D.packs.filter((p) => p.kernels.includes(id) || p.name === id);
  if (lays.length || packs.length) h += "<h3>launch decisions</h3>" + lays.map((p) => item(p.kinds, "", p.text, p.plain)).join("") + packs.map((p) => item(p.kinds, "", p.text, p.plain)).join("");
  const mem = k.memory;
  if (mem.engine || mem.buffers.length) {
    h += `<h3>on-chip memory and pipeline</h3><div>${esc(mem.plain)}</div><table>`;
    if (mem.engine) h += `<tr><td>engine</td><td><b>${esc(mem.engine)}</b>${mem.intrinsic ? " (" + esc(mem.intrinsic) + ")" : ""}</td></tr><tr><td>stages</td><td><b>${mem.stages}</b> (${esc(mem.fill)})</td></tr>`;
    h += mem.buffers.map((b) => `<tr><td>shared ${esc(b.tensor)}</td><td>${b.bytes ? fmtB(b.bytes) + " per stage; " : ""}${b.layout ? "<b>" + esc(b.layout) + "</b>; " : ""}${esc(b.reason)}</td></tr>`).join("");
    if (mem.arrays.length) h += `<tr><td>__shared__ arrays</td><td>${mem.arrays.map(fmtB).join(" + ")} (stages included)</td></tr>`;
    if (mem.dynamic) h += `<tr><td>dynamic pool</td><td>${fmtB(mem.dynamic)}</td></tr>`;
    if (mem.region.length) h += `<tr><td>tensorized region</td><td>source lines ${mem.region[0] + 1}–${mem.region[1] + 1} (highlighted below)</td></tr>`;
    h += "</table>";
  }
  h += "<h3>placements</h3><table>" + k.placements.map((p) => `<tr><td>${esc(p.tensor)}</td><td><b>${esc(p.space)}</b></td><td>${esc(p.reason)}${p.bytes ? " (" + fmtB(p.bytes) + ")" : ""}</td></tr>`).join("") + "</table>";
  if (k.notes.length) h += "<h3>notes</h3>" + k.notes.map((n) => `<div>${esc(n)}</div>`).join("");
  const lines = k.source.split("\n");
  const partOf = new Array(lines.length).fill(-1);
  k.parts.forEach((p, i) => { for (let j = p.start; j <= p.end && j < lines.length; j++) partOf[j] = i; });
  h += '<h3>CUDA source</h3><pre class="src" id="kernel-source">' + lines.map((ln, j) => {
    const pi = partOf[j], tc = mem.region.length && j >= mem.region[0] && j <= mem.region[1] ? " tc" : "";
    if (pi < 0) return `<span class="ln${tc}">${esc(ln) || " "}</span>`;
    const p = k.parts[pi];
    return `<span class="ln part${tc}${p.mg === hlMg ? " hl" : ""}" data-mg="${p.mg}" style="border-left-color:${PART_COLORS[k.micrographs.indexOf(p.mg) % PART_COLORS.length]}">${esc(ln) || " "}</span>`;
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
  const hits = D.prims.filter((p) => (p.id + " " + p.composite + " " + p.kind + " " + p.kernel + " " + p.mg).toLowerCase().includes(q));
  if (!hits.length) return;
  reveal(hits[0].kernel);
  hits.forEach((p) => { if (nodeG[p.id]) nodeG[p.id].classList.add("match"); });
  centerOn(boxNow(L.nodes[hits[0].id], hits[0].kernel));
});

// ------------------------------------------------------------------ deep links
function followHash(){
  const h = decodeURIComponent(location.hash.slice(1)), eq = h.indexOf("=");
  if (eq <= 0) return;
  const key = h.slice(0, eq), val = h.slice(eq + 1);
  if (key === "kernel" && kById[val]) { showKernel(val); centerOn(boxNow(L.kernels[val], val)); }
  else if (key === "edge" && D.decisions[+val]) selectDecision(+val, false);
  else if (key === "mg" && mgById[val]) { showMicrograph(val); centerOn(boxNow(L.micrographs[val], mgById[val].kernel)); }
  else if (key === "op" && primById[val]) { selectPrim(val); centerOn(boxNow(L.nodes[val], primById[val].kernel)); }
}
window.addEventListener("hashchange", followHash);

svg.addEventListener("click", () => { if (!drag) clearSel(); });
renderDecisions("");
renderProfile();
relayout();
fit();
followHash();
window.__polyfuseReadyMs = performance.now();  // navigation start to drawn, for tests
window.__polyfuseReady = true;
"""
