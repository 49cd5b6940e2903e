"""The wheel holds every package of the source tree (CI installs it non-editable)."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_found_by_pyproject():
    """The checkout's folders are the installed layout: every package is under polyfuse/ and
    setuptools' discovery (pyproject's include) finds each one."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in cfg, "the checkout is the installed layout: no package-dir"
    assert cfg["packages"]["find"]["include"] == ["polyfuse", "polyfuse.*"]
    found = [
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "polyfuse").rglob("__init__.py")
    ]
    missing = [pkg for pkg in found if importlib.util.find_spec(pkg) is None]
    assert missing == [], "packages the install left out"
    tops = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert tops == {"polyfuse"}, "a package folder outside polyfuse/"
