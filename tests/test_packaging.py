"""The wheel holds every package of the source tree (CI installs it non-editable)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = {v: k for k, v in cfg["package-dir"].items()}  # source folder -> package name
    found = set()
    for init in ROOT.glob("*/**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        top = rel.parts[0]
        if top not in dirs:
            continue  # tests/, benchmarks/, .venv/ ...
        found.add(".".join([dirs[top], *rel.parts[1:]]))
    assert found - listed == set(), "add these to [tool.setuptools] packages"
