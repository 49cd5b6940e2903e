"""``POLYFUSE_CACHE`` is parsed in one place and every cache agrees with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyfuse.base.settings import DEFAULT_CACHE_ROOT, cache_root
from polyfuse.cache import default_dir
from polyfuse.cuda.toolchain.compiler import cache_dir


@pytest.mark.parametrize("off", ["off", "OFF", "0", "none", " false "])
def test_off_disables_every_cache(monkeypatch, off):
    monkeypatch.setenv("POLYFUSE_CACHE", off)
    assert cache_root() is None and default_dir() is None and cache_dir() is None


def test_a_directory_roots_every_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("POLYFUSE_CACHE", str(tmp_path))
    assert default_dir() == tmp_path / "compile"
    assert cache_dir() == tmp_path / "cuda"


def test_unset_or_empty_is_the_home_cache(monkeypatch):
    monkeypatch.delenv("POLYFUSE_CACHE", raising=False)
    assert cache_root() == DEFAULT_CACHE_ROOT
    monkeypatch.setenv("POLYFUSE_CACHE", "")
    assert cache_root() == DEFAULT_CACHE_ROOT
    monkeypatch.setenv("POLYFUSE_CACHE", "~/pf")
    assert cache_root() == Path.home() / "pf"
