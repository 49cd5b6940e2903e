"""The report in headless Chromium (Debian ``chromium`` + ``chromium-driver``, via selenium).

Opens reports for layer norm, an attention block and BERT-base (the zoo's, full size: slow
tier; its tiny size in the fast tier); checks the kernel and micrograph counts shown equal the
plan's, clicks a kernel and sees its CUDA source, clicks a refused edge and sees its reason with
its plain-language line, measures every visible label's box (none overlap, as opened, collapsed,
expanded and zoomed in), sees no console errors. On BERT it also checks the overview (one card
per repeated layer, all in view and readable, the minimap), unfolds and folds a layer by
clicking, follows ``#mg=``/``#kernel=``/``#edge=`` links by ``hashchange`` in the open page, and
finds a plain-language line beside every reason of every kind shown. Screenshots go to
tests/artifacts/ (gitignored). Skips when chromium is missing, except where ``.ci/run`` has
installed the extras (``POLYFUSE_EXTRAS=required``: its extras step and slow tier), where it
fails; the fast tier before them skips it like a newcomer's run, ``CI=true`` or not.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

import polyfuse
from polyfuse import examples

ARTIFACTS = Path(__file__).parent / "artifacts"
MAX_LOAD_S = 3.0
MAX_HTML_BYTES = 5 * 1024 * 1024
CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
]


def _find(*names):
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


pytestmark = pytest.mark.extra  # needs Chromium (CI's extras step)


@pytest.fixture(scope="module")
def browser():
    chrome = _find("chromium", "chromium-browser", "google-chrome")
    driver_bin = _find("chromedriver")
    missing = []
    if chrome is None or driver_bin is None:
        missing.append("chromium/chromium-driver not installed")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium not installed")
    if missing:
        if os.environ.get("POLYFUSE_EXTRAS") == "required":
            pytest.fail("; ".join(missing) + " (required: POLYFUSE_EXTRAS=required)")
        pytest.skip("; ".join(missing))
    profile = tempfile.mkdtemp(prefix="polyfuse-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in CHROME_FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(driver_bin), options=opts)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _open(drv, path: Path) -> float:
    """Load the report; returns the seconds from navigation until the page is drawn (its
    data inflated, the graph laid out, the panels filled)."""
    drv.get(path.resolve().as_uri())
    deadline = time.time() + 30
    while not drv.execute_script("return window.__polyfuseReady === true"):
        assert time.time() < deadline, "report script never finished"
        time.sleep(0.05)
    ms = drv.execute_script(
        "return window.__polyfuseReadyMs ||"
        " performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"
    )
    return ms / 1000.0


#: Visible text of the drawing whose boxes overlap (screen pixels, 1 px of slack).
_OVERLAPS_JS = """
const boxes = [];
document.querySelectorAll('#graph text').forEach((t) => {
  if (!t.textContent.trim() || t.getClientRects().length === 0) return;
  const r = t.getBoundingClientRect();
  if (r.width > 0 && r.height > 0) boxes.push([r.left, r.top, r.right, r.bottom, t.textContent]);
});
boxes.sort((a, b) => a[0] - b[0]);
const bad = [];
for (let i = 0; i < boxes.length; i++) {
  for (let j = i + 1; j < boxes.length && boxes[j][0] < boxes[i][2] - 1; j++) {
    const a = boxes[i], b = boxes[j];
    const dx = Math.min(a[2], b[2]) - Math.max(a[0], b[0]);
    const dy = Math.min(a[3], b[3]) - Math.max(a[1], b[1]);
    if (dx > 1 && dy > 1) bad.push([a[4], b[4]]);
  }
}
return [boxes.length, bad.slice(0, 10), bad.length];
"""


def _labels_apart(drv, where: str) -> int:
    """Asserts no two visible labels of the drawing overlap; returns how many were checked."""
    n, bad, n_bad = drv.execute_script(_OVERLAPS_JS)
    assert n_bad == 0, f"{where}: {n_bad} overlapping labels, e.g. {bad}"
    return n


def _click(drv, elem) -> None:
    drv.execute_script("arguments[0].dispatchEvent(new MouseEvent('click',{bubbles:true}))", elem)


def _zoom_in(drv, notches: int = 1) -> None:
    """Wheel turns over the drawing, each zooming 1.35x (edge labels show from 0.7x up)."""
    drv.execute_script(
        "const r = document.getElementById('graph').getBoundingClientRect();"
        "for (let i = 0; i < arguments[0]; i++) document.getElementById('graph').dispatchEvent("
        "new WheelEvent('wheel', {deltaY: -200, clientX: r.left + r.width / 3,"
        " clientY: r.top + r.height / 2, bubbles: true, cancelable: true}));",
        notches,
    )


def _shot(drv, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    drv.save_screenshot(str(ARTIFACTS / name))
    print(f"screenshot: {ARTIFACTS / name}")


def _errors(drv) -> list:
    return [e for e in drv.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def _check_report(drv, fn, path: Path, shot: str) -> float:
    from selenium.webdriver.common.by import By

    drv.get_log("browser")  # drop anything from earlier pages
    load_s = _open(drv, path)
    _labels_apart(drv, "as opened")
    # a folded block draws its contents when first shown: unfold everything, then count
    drv.find_element(By.ID, "expand-all").click()
    n_k = drv.execute_script("return document.querySelectorAll('#graph g.kernel').length")
    n_mg = drv.execute_script("return document.querySelectorAll('#graph g.mg').length")
    assert n_k == len(fn.kernels)
    assert n_mg == len(fn.plan.micrographs)
    assert drv.find_element(By.ID, "n-kernels").text == str(len(fn.kernels))
    assert drv.find_element(By.ID, "n-mgs").text == str(len(fn.plan.micrographs))

    # click a kernel: its CUDA source shows
    k = fn.kernels[-1]
    title = drv.find_element(By.CSS_SELECTOR, f'#graph g.kernel[data-id="{k.name}"] > text')
    drv.execute_script("arguments[0].scrollIntoView()", title)
    _click(drv, title)
    src = drv.find_element(By.ID, "kernel-source").text
    fname = k.function or k.name  # identical kernels share one function (cuda/codegen/dedup.py)
    # (a GEMM kernel's bounds also name its blocks per SM: poly/gemm_loops.py)
    assert re.search(rf"__global__ void __launch_bounds__\({k.block[0]}(, \d+)?\) {fname}\(", src)
    assert drv.find_element(By.ID, "v-kernel").is_displayed()

    # click a refused edge: its reason shows, and beside it the same in plain words
    refused = [d for d in fn.plan.partition.decisions if not d.fused]
    assert refused
    d = refused[0]
    i = fn.plan.partition.decisions.index(d)
    hit = drv.find_element(By.CSS_SELECTOR, f'#graph g.edge[data-dec="{i}"] path.hit')
    _click(drv, hit)
    detail = drv.find_element(By.ID, "detail").text
    assert d.reason in " ".join(detail.split())
    assert f"{d.producer} → {d.consumer}" in detail
    plain = drv.find_elements(By.CSS_SELECTOR, "#detail .plain")
    assert plain and all(p.text.strip() for p in plain)

    # collapse everything, expand, search: no errors
    drv.find_element(By.ID, "collapse-all").click()
    hidden = drv.execute_script("return document.querySelectorAll('#graph g.node.hidden').length")
    assert hidden == len(fn.plan.graph.prims)
    _labels_apart(drv, "kernels collapsed")
    drv.find_element(By.ID, "expand-all").click()
    _zoom_in(drv, 2)
    labels = "return document.querySelectorAll('#graph text.elabel:not(.hidden)').length"
    assert drv.execute_script(labels)  # edge labels shown, where they fit
    _labels_apart(drv, "all expanded, zoomed in")
    drv.find_element(By.ID, "search").send_keys(d.producer)
    assert drv.execute_script("return document.querySelectorAll('#graph g.node.match').length")

    assert not _errors(drv), _errors(drv)
    _shot(drv, shot)
    return load_s


def test_layer_norm_report(browser, tmp_path):
    ins, outs, _ = examples.layer_norm()
    fn = polyfuse.compile(ins, outs, name="layer_norm")
    fn.visualize(tmp_path / "ln.html")
    _check_report(browser, fn, tmp_path / "ln.html", "viz_layer_norm.png")


def test_attention_report(browser, tmp_path):
    ins, outs, _ = examples.attention()
    fn = polyfuse.compile(ins, outs, name="attention")
    fn.visualize(tmp_path / "att.html")
    _check_report(browser, fn, tmp_path / "att.html", "viz_attention.png")


def _wait(drv, js: str, what: str, timeout: float = 10.0):
    deadline = time.time() + timeout
    while True:
        got = drv.execute_script(js)
        if got:
            return got
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


_RECT_JS = (
    "const r = arguments[0].getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom];"
)


def _rect(drv, css: str):
    from selenium.webdriver.common.by import By

    return drv.execute_script(_RECT_JS, drv.find_element(By.CSS_SELECTOR, css))


def _inside(inner, outer, slack: float = 1.0) -> bool:
    return (
        inner[0] >= outer[0] - slack
        and inner[1] >= outer[1] - slack
        and inner[2] <= outer[2] + slack
        and inner[3] <= outer[3] + slack
    )


_VISIBLE_CARDS_JS = (
    "return [...document.querySelectorAll('#graph g.card')]"
    ".filter((c) => c.getClientRects().length).map((c) => c.dataset.seg)"
)
_SHOWN_JS = "return arguments[0].getClientRects().length > 0"
#: Where the page draws a segment: its vertical offset (the drawing's units, not the screen's).
_OFFSET_JS = (
    "const g = document.querySelector('#layer-segments > g.seg[data-seg=\"' + arguments[0]"
    " + '\"]'); return g.transform.baseVal.consolidate().matrix.f;"
)


def _fold_layers(drv) -> list[str]:
    """The page with every repeated layer folded; returns the cards shown, in order."""
    from selenium.webdriver.common.by import By

    fold = drv.find_elements(By.ID, "fold-layers")
    if fold and fold[0].is_displayed():
        fold[0].click()
    return drv.execute_script(_VISIBLE_CARDS_JS)


def _check_overview(drv, path: Path, layers: int, name: str) -> None:
    """One card per repeated layer, all in view and readable, the minimap drawn."""
    drv.get_log("browser")
    _open(drv, path)
    cards = _fold_layers(drv)
    assert len(cards) == layers, f"{len(cards)} layer cards for {layers} layers"
    pane = _rect(drv, "#graph")
    for c in cards:
        assert _inside(_rect(drv, f'#graph g.card[data-seg="{c}"]'), pane), c
    title = _rect(drv, f'#graph g.card[data-seg="{cards[0]}"] text.ctitle')
    assert title[3] - title[1] >= 10, "card titles are too small to read"
    mm = _rect(drv, "#minimap")
    assert mm[2] - mm[0] > 50 and mm[3] - mm[1] > 20
    _labels_apart(drv, "overview")
    _shot(drv, f"viz_{name}_overview.png")
    # a click in the minimap moves the view there: its top edge, to the top of the drawing
    view = "return document.getElementById('viewport').getAttribute('transform')"
    before = drv.execute_script(view)
    drv.execute_script(
        "const m = document.getElementById('minimap'), r = m.getBoundingClientRect();"
        "m.dispatchEvent(new MouseEvent('mousedown', {clientX: r.left + r.width / 2,"
        " clientY: r.top + 1, bubbles: true}));"
        "window.dispatchEvent(new MouseEvent('mouseup', {bubbles: true}));"
    )
    assert drv.execute_script(view) != before
    first = _rect(drv, f'#graph g.card[data-seg="{cards[0]}"]')
    assert abs((first[1] + first[3]) / 2 - (pane[1] + pane[3]) / 2) < 2 * (first[3] - first[1])
    assert not _errors(drv), _errors(drv)


def _check_unfold(drv, data, path: Path, name: str) -> None:
    """Click a card: its layer unfolds in place and what is below moves down by what the
    layer takes unfolded; click the layer's frame title: it folds back."""
    from selenium.webdriver.common.by import By

    drv.get_log("browser")
    _open(drv, path)
    cards = _fold_layers(drv)
    assert len(cards) >= 2, "no layer cards"
    seg, below = cards[0], cards[1]
    y0 = drv.execute_script(_OFFSET_JS, below)
    _click(drv, drv.find_element(By.CSS_SELECTOR, f'#graph g.card[data-seg="{seg}"]'))
    frame = drv.find_element(By.CSS_SELECTOR, f'#graph g.frame[data-seg="{seg}"]')
    assert drv.execute_script(_SHOWN_JS, frame)
    kernels = next(s["kernels"] for s in data["groups"]["segments"] if s["id"] == seg)
    for k in kernels:
        g = drv.find_element(By.CSS_SELECTOR, f'#graph g.kernel[data-id="{k}"]')
        assert drv.execute_script(_SHOWN_JS, g), k
    assert drv.execute_script(_VISIBLE_CARDS_JS) == cards[1:]
    box, card = (data["layout"]["segments"][seg][k] for k in ("box", "card"))
    moved = drv.execute_script(_OFFSET_JS, below) - y0
    assert abs(moved - (box[3] - card[3])) < 0.01, moved
    _labels_apart(drv, "one layer unfolded")
    _shot(drv, f"viz_{name}_layer_unfolded.png")
    _zoom_in(drv)
    _labels_apart(drv, "one layer unfolded, zoomed in")
    _click(drv, drv.find_element(By.CSS_SELECTOR, f'#graph g.frame[data-seg="{seg}"] > text'))
    assert not drv.execute_script(_SHOWN_JS, frame)
    assert drv.execute_script(_VISIBLE_CARDS_JS) == cards
    assert abs(drv.execute_script(_OFFSET_JS, below) - y0) < 0.01
    assert not _errors(drv), _errors(drv)


def _check_hashchange(drv, fn, path: Path, name: str) -> None:
    """Deep links in the open page: set the hash, the page selects the target and scrolls to
    it (unfolding its layer first, where layers fold)."""
    from selenium.webdriver.common.by import By

    drv.get_log("browser")
    _open(drv, path)
    _fold_layers(drv)
    pane = _rect(drv, "#graph")
    mg = fn.kernels[-2].micrographs[0]  # far from the first screen, folded where layers fold
    drv.execute_script("location.hash = arguments[0]", f"#mg={mg}")
    title = "return (document.getElementById('mg-title') || {}).textContent || ''"
    _wait(drv, f"{title}.includes('micrograph {mg} ')", f"#mg={mg}", timeout=5)
    assert drv.find_element(By.ID, "v-micrograph").is_displayed()
    sel = drv.find_element(By.CSS_SELECTOR, f'#graph g.mg[data-id="{mg}"]')
    assert "sel" in sel.get_attribute("class")
    box = _rect(drv, f'#graph g.mg[data-id="{mg}"] > rect')
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    assert pane[0] <= cx <= pane[2] and pane[1] <= cy <= pane[3], (box, pane)  # scrolled to
    _labels_apart(drv, f"after #mg={mg}")
    _shot(drv, f"viz_{name}_hash_mg.png")
    k = fn.kernels[1].name
    drv.execute_script("location.hash = arguments[0]", f"#kernel={k}")
    title = "return (document.getElementById('kernel-title') || {}).textContent"
    _wait(drv, f"{title} === 'kernel {k}'", f"#kernel={k}", timeout=5)
    sel = drv.find_element(By.CSS_SELECTOR, f'#graph g.kernel[data-id="{k}"]')
    assert "sel" in sel.get_attribute("class")
    decs = fn.plan.partition.decisions
    i = max(j for j, d in enumerate(decs) if not d.fused)
    drv.execute_script("location.hash = arguments[0]", f"#edge={i}")
    dec = "return (document.getElementById('detail') || {dataset: {}}).dataset.dec"
    _wait(drv, f"{dec} === '{i}'", f"#edge={i}", timeout=5)
    assert decs[i].reason in " ".join(drv.find_element(By.ID, "detail").text.split())
    assert not _errors(drv), _errors(drv)


def _check_plain(drv, data, path: Path) -> None:
    """Every kind of reason the report shows has a plain-language line beside each reason."""
    from selenium.webdriver.common.by import By

    from polyfuse.viz import kinds_present

    drv.get_log("browser")
    _open(drv, path)
    kinds = sorted(kinds_present(data))
    assert len(kinds) >= 5, kinds
    records = data["decisions"] + data["packs"] + data["launch_layouts"] + data["stitches"]
    for kind in kinds:
        drv.execute_script(
            "const s = document.getElementById('kind-filter'); s.value = arguments[0];"
            "s.dispatchEvent(new Event('change'));",
            kind,
        )
        n, missing = drv.execute_script(
            "const all = [...document.querySelectorAll('#v-decisions .dec, #v-decisions .item')];"
            "return [all.length, all.filter((e) => !(e.querySelector('.plain') || "
            "{textContent: ''}).textContent.trim()).length];"
        )
        assert n and missing == 0, f"{kind}: {missing} of {n} reasons without plain words"
        text = " ".join(drv.find_element(By.ID, "v-decisions").text.split())
        lines = [" ".join(r.get("plain", "").split()) for r in records if kind in r["kinds"]]
        assert any(x and x in text for x in lines), kind
    assert not _errors(drv), _errors(drv)


def _bert(size: str):
    try:
        from polyfuse import zoo
    except ImportError:
        zoo = None
    if zoo is not None and "bert_base" in getattr(zoo, "MODELS", {}):
        m = zoo.build("bert_base", size, weights="zeros")
        fn = polyfuse.compile(
            m.inputs, m.outputs, constants=m.constants, check_cuda=False, name=f"bert_{size}"
        )
        return fn, zoo.MODELS["bert_base"].configs[size]["layers"]
    pytest.skip("polyfuse.zoo has no bert_base")


@pytest.fixture(scope="module")
def bert_tiny(tmp_path_factory):
    from polyfuse.viz import visualize

    fn, layers = _bert("tiny")
    path = tmp_path_factory.mktemp("viz") / "bert_tiny.html"
    return fn, visualize(fn, path), path, layers


def _report_figures(fn, path: Path, load_s: float, size: str) -> None:
    nbytes = path.stat().st_size
    print(
        f"BERT-base ({size}): {len(fn.plan.graph.prims)} primitives, "
        f"{len(fn.plan.micrographs)} micrographs, {len(fn.kernels)} kernels; "
        f"HTML {nbytes / 1e6:.2f} MB, drawn in {load_s:.2f} s"
    )
    assert nbytes < MAX_HTML_BYTES
    assert load_s < MAX_LOAD_S


def test_bert_tiny_report(browser, bert_tiny):
    fn, _, path, _ = bert_tiny
    _report_figures(fn, path, _check_report(browser, fn, path, "viz_bert_tiny.png"), "tiny")


def test_bert_tiny_overview_folds_layers(browser, bert_tiny):
    fn, _, path, layers = bert_tiny
    _check_overview(browser, path, layers, "bert_tiny")


def test_bert_tiny_layer_unfolds_and_folds_by_clicking(browser, bert_tiny):
    fn, data, path, _ = bert_tiny
    _check_unfold(browser, data, path, "bert_tiny")


def test_bert_tiny_hashchange_selects_and_scrolls(browser, bert_tiny):
    fn, _, path, _ = bert_tiny
    _check_hashchange(browser, fn, path, "bert_tiny")


def test_bert_tiny_plain_words_for_every_kind(browser, bert_tiny):
    _, data, path, _ = bert_tiny
    _check_plain(browser, data, path)


@pytest.mark.slow
def test_bert_base_report_opens_fast(browser, tmp_path):
    """BERT-base at full size: 192 kernels, all of the above."""
    from polyfuse.viz import visualize

    fn, layers = _bert("full")
    path = tmp_path / "bert_full.html"
    data = visualize(fn, path)
    assert data["groups"]["collapse_at_load"]  # opens as twelve cards
    load_s = _check_report(browser, fn, path, "viz_bert_full.png")
    _check_overview(browser, path, layers, "bert_full")
    _check_unfold(browser, data, path, "bert_full")
    _check_hashchange(browser, fn, path, "bert_full")
    _check_plain(browser, data, path)
    _report_figures(fn, path, load_s, "full")
