# ruff: noqa: E501  (HTML and CSS inside a string)
"""The report page: our own HTML, CSS and JavaScript, no third-party code, no network.

``__DATA__`` is replaced by the report JSON, gzip-compressed and base64-encoded, inside a
``<script type="application/octet-stream">`` element; the page inflates it with the browser's
own ``DecompressionStream`` and draws it as SVG (:mod:`polyfuse.viz.script_graph` draws and lays
out labels, :mod:`polyfuse.viz.script_panels` fills the side panels and follows deep links).
"""

from polyfuse.viz.script_graph import SCRIPT_GRAPH
from polyfuse.viz.script_panels import SCRIPT_PANELS

_HEAD = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>polyfuse report: __TITLE__</title>
<style>
:root{--bg:#fbfbfa;--fg:#222;--mut:#667;--line:#ccd;--sel:#f5a623;--plain:#2d5f8a}
*{box-sizing:border-box}
body{margin:0;font:13px/1.35 "DejaVu Sans",system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:var(--fg);background:var(--bg);height:100vh;display:flex;flex-direction:column}
header{display:flex;gap:10px;align-items:center;padding:6px 10px;border-bottom:1px solid var(--line);background:#fff;flex-wrap:wrap}
header h1{font-size:15px;margin:0}
header .stat b{font-variant-numeric:tabular-nums}
header input{padding:3px 6px;width:170px}
header button{padding:2px 8px}
#fatal{background:#fdd;padding:8px;font-weight:600}
main{flex:1;display:flex;min-height:0}
#graphwrap{flex:1 1 58%;position:relative;overflow:hidden;border-right:1px solid var(--line);background:#fff}
#graph{width:100%;height:100%;cursor:grab;user-select:none}
#graph text{font-family:inherit}
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
.dec{cursor:pointer;border-bottom:1px solid #eee;padding:4px 4px 5px}
.dec:hover{background:#f0f4ff}
.dec.sel{background:#fff3d6}
.dec .o-fused{color:#282}.dec .o-stitched{color:#25a}.dec .o-separate{color:#b22}
.plain{color:var(--plain);font-size:12px;margin:1px 0 2px 0;padding-left:8px;border-left:3px solid #b9d3ea}
.plain::before{content:"in plain words: ";color:#7a9bb8;font-style:italic}
.dec .plain::before{content:none}
.item{margin:3px 0 7px}
.stage{color:var(--mut);font-size:11px;text-transform:uppercase;letter-spacing:.03em}
.pill{display:inline-block;border-radius:8px;padding:0 6px;margin:0 2px 1px 0;font-size:11px;background:#eee}
.k-fused{background:#d9f2d9}.k-stitched{background:#d6e6ff}.k-no-rule{background:#eee}.k-cycle{background:#ffe0c2}
.k-isl-feedback{background:#f6d5f7}.k-form-mismatch{background:#ffd6d6}.k-tile-mismatch{background:#ffd6d6}
.k-footprint{background:#fff0a8}.k-cost-model{background:#dff7f4}.k-packed{background:#d6e6ff}
.src .ln{display:block}
.src .part{border-left:4px solid transparent;padding-left:4px}
.src .hl{background:#fff3c4}
.src .tc{background:#e6f4ea}
h2{font-size:14px;margin:10px 0 4px}
h3{font-size:13px;margin:10px 0 3px}
.mut{color:var(--mut)}
.node rect{stroke:#555;stroke-width:1;rx:4}
.node text{pointer-events:none}
.node{cursor:pointer}
.node.out rect{stroke-width:2.5}
.node.sel rect,.node.match rect{stroke:var(--sel);stroke-width:3}
.kernel>rect.box{fill:#f3f6fb;stroke:#7a8fb5;stroke-width:1.5}
.kernel>text{fill:#345;cursor:pointer}
.kernel.sel>rect.box{stroke:var(--sel);stroke-width:3}
.kernel.collapsed>rect.box{fill:#c9d6ee}
.mg>rect{fill:#fff;stroke:#aab}
.mg>text{fill:#556;cursor:pointer}
.mg.sel>rect{stroke:var(--sel);stroke-width:2.5}
.comp>rect{fill:none;stroke:#b46;stroke-dasharray:5 3;stroke-width:1.2}
.comp.collapsed>rect{fill:#f7e3ec;fill-opacity:.95}
text.ctag{fill:#b46;cursor:pointer}
.frame>rect{fill:#fafbfd;stroke:#8a9cc0;stroke-width:1.2;stroke-dasharray:7 4}
.frame>text{fill:#345;cursor:pointer}
.card{cursor:pointer}
.card>rect.cardbox{fill:#e8eef8;stroke:#7a8fb5;stroke-width:1.5}
.card:hover>rect.cardbox{fill:#dde6f5}
.card.sel>rect.cardbox{stroke:var(--sel);stroke-width:3}
.card>text.ctitle{fill:#234}
.card>text.cstats{fill:#556}
.chip{stroke:#667;stroke-width:.8;cursor:pointer}
.chip:hover{stroke:var(--sel);stroke-width:2}
.chip.sep-in{stroke:#d33;stroke-width:1.6}
.pin rect{fill:#eee;stroke:#999;rx:9}
.pin text{fill:#444}
.edge path.vis{fill:none;stroke-width:1.4}
.edge path.hit{fill:none;stroke:transparent;stroke-width:9;cursor:pointer}
.edge.fused path.vis{stroke:#3a3}
.edge.stitched path.vis{stroke:#36c}
.edge.separate path.vis{stroke:#d33;stroke-dasharray:4 3}
.edge.input path.vis{stroke:#bbb}
.edge.folded path.vis{stroke:#9fb0d0;stroke-width:1.3;stroke-dasharray:none;opacity:.75}
.edge.sel path.vis{stroke:var(--sel);stroke-width:3}
text.elabel{fill:#666;pointer-events:none}
.hidden{display:none}
svg.nolabels text.elabel{display:none}
#legend{position:absolute;left:8px;bottom:8px;background:#fffd;border:1px solid var(--line);padding:4px 8px;font-size:11px}
#legend span.sw{display:inline-block;width:10px;height:10px;margin:0 3px 0 8px;vertical-align:middle;border:1px solid #555}
#toolbar{position:absolute;left:8px;top:8px;display:flex;gap:4px}
#toolbar button{padding:2px 8px;font-size:12px;background:#fffe;border:1px solid #bbc;border-radius:4px;cursor:pointer}
#toolbar button:hover{background:#eef3ff}
#minimap-box{position:absolute;right:8px;top:8px;background:#fffe;border:1px solid var(--line);padding:3px;box-shadow:0 1px 4px #0002;opacity:.88}
#minimap-box:hover{opacity:1}
#minimap-box .mut{font-size:10px;display:block;margin-bottom:2px}
#minimap{display:block;cursor:crosshair}
#detail{border:1px solid var(--line);background:#fff;padding:6px;margin-bottom:8px}
#detail>div{margin:3px 0}
.bar{height:12px;background:#6a8fd0;display:inline-block;vertical-align:middle}
</style></head>
<body>
<div id="fatal" hidden></div>
<header>
<h1>polyfuse report: <span id="title"></span></h1>
<span class="stat"><b id="n-prims"></b> primitives · <b id="n-mgs"></b> micrographs · <b id="n-kernels"></b> kernels · <b id="n-decs"></b> edges<span id="layers-stat" hidden> · <b id="n-layers"></b></span></span>
<span class="stat mut" id="bytes"></span>
<input id="search" type="search" placeholder="search ops, tensors, kernels…">
</header>
<main>
<div id="graphwrap"><svg id="graph" xmlns="http://www.w3.org/2000/svg"><g id="viewport"></g></svg>
<div id="toolbar"><button id="fold-layers" hidden title="fold every repeated block (layer) into one card">fold layers</button><button id="unfold-layers" hidden title="show the kernels of every repeated block">unfold layers</button><button id="collapse-all" title="hide what is inside every kernel">collapse kernels</button><button id="expand-all" title="unfold every block, kernel and composite">expand all</button><button id="fit" title="fit the drawing to the pane">fit</button></div>
<div id="minimap-box"><span class="mut">overview (click to go)</span><canvas id="minimap"></canvas></div>
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
<script type="application/octet-stream" id="report-data" data-encoding="gzip+base64">__DATA__</script>
<script>
"""

_TAIL = r"""
</script></body></html>
"""

#: The page: the shell above, then one script whose two parts share one function scope.
TEMPLATE = (
    _HEAD
    + '"use strict";\n(async function(){\n'
    + SCRIPT_GRAPH
    + SCRIPT_PANELS
    + "\n})().catch((e) => { console.error(e); });"
    + _TAIL
)
