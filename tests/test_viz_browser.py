"""The report in headless Chromium (Debian ``chromium`` + ``chromium-driver``, via selenium).

Opens reports for layer norm, an attention block and BERT-base (the zoo's, full size: slow
tier; its tiny size in the fast tier); checks the kernel and micrograph counts shown equal the
plan's, clicks a kernel and sees its CUDA source, clicks a refused edge and sees its reason,
sees no console errors, saves a screenshot to tests/artifacts/. Skips when chromium is missing,
except under CI=true, where it fails.
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
        if os.environ.get("CI") == "true":
            pytest.fail("; ".join(missing) + " (required under CI=true)")
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
    """Load the report; returns DOM ready (DOMContentLoaded) in seconds after navigation."""
    drv.get(path.resolve().as_uri())
    deadline = time.time() + 30
    while not drv.execute_script("return window.__polyfuseReady === true"):
        assert time.time() < deadline, "report script never finished"
        time.sleep(0.05)
    ms = drv.execute_script(
        "const t = performance.getEntriesByType('navigation')[0];"
        "return t ? t.domContentLoadedEventEnd : "
        "performance.timing.domContentLoadedEventEnd - performance.timing.navigationStart;"
    )
    return ms / 1000.0


def _check_report(drv, fn, path: Path, shot: str) -> float:
    from selenium.webdriver.common.by import By

    drv.get_log("browser")  # drop anything from earlier pages
    load_s = _open(drv, path)
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
    drv.execute_script("arguments[0].dispatchEvent(new MouseEvent('click',{bubbles:true}))", title)
    src = drv.find_element(By.ID, "kernel-source").text
    fname = k.function or k.name  # identical kernels share one function (cuda/dedup.py)
    # (a GEMM kernel's bounds also name its blocks per SM: poly/gemm_loops.py)
    assert re.search(rf"__global__ void __launch_bounds__\({k.block[0]}(, \d+)?\) {fname}\(", src)
    assert drv.find_element(By.ID, "v-kernel").is_displayed()

    # click a refused edge: its reason shows
    refused = [d for d in fn.plan.partition.decisions if not d.fused]
    assert refused
    d = refused[0]
    i = fn.plan.partition.decisions.index(d)
    hit = drv.find_element(By.CSS_SELECTOR, f'#graph g.edge[data-dec="{i}"] path.hit')
    drv.execute_script("arguments[0].dispatchEvent(new MouseEvent('click',{bubbles:true}))", hit)
    detail = drv.find_element(By.ID, "detail").text
    assert d.reason in " ".join(detail.split())
    assert f"{d.producer} → {d.consumer}" in detail

    # collapse everything, expand, search: no errors
    drv.find_element(By.ID, "collapse-all").click()
    hidden = drv.execute_script("return document.querySelectorAll('#graph g.node.hidden').length")
    assert hidden == len(fn.plan.graph.prims)
    drv.find_element(By.ID, "expand-all").click()
    drv.find_element(By.ID, "search").send_keys(d.producer)
    assert drv.execute_script("return document.querySelectorAll('#graph g.node.match').length")

    errors = [e for e in drv.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors
    ARTIFACTS.mkdir(exist_ok=True)
    drv.save_screenshot(str(ARTIFACTS / shot))
    print(f"screenshot: {ARTIFACTS / shot}")
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


def _bert(size: str):
    try:
        from polyfuse import zoo
    except ImportError:
        zoo = None
    if zoo is not None and "bert_base" in getattr(zoo, "MODELS", {}):
        m = zoo.build("bert_base", size, weights="zeros")
        return polyfuse.compile(
            m.inputs, m.outputs, constants=m.constants, check_cuda=False, name=f"bert_{size}"
        )
    pytest.skip("polyfuse.zoo has no bert_base")


def _large(browser, tmp_path, size: str):
    fn = _bert(size)
    path = tmp_path / f"bert_{size}.html"
    fn.visualize(path)
    nbytes = path.stat().st_size
    load_s = _check_report(browser, fn, path, f"viz_bert_{size}.png")
    print(
        f"BERT-base ({size}): {len(fn.plan.graph.prims)} primitives, "
        f"{len(fn.plan.micrographs)} micrographs, {len(fn.kernels)} kernels; "
        f"HTML {nbytes / 1e6:.2f} MB, DOM ready in {load_s:.2f} s"
    )
    assert nbytes < MAX_HTML_BYTES
    assert load_s < MAX_LOAD_S


def test_bert_tiny_report(browser, tmp_path):
    _large(browser, tmp_path, "tiny")


@pytest.mark.slow
def test_bert_base_report_opens_fast(browser, tmp_path):
    _large(browser, tmp_path, "full")
