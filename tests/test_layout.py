"""One file, one module: tests import the installed package, and nothing edits ``__path__``.

Every package lives under the checkout's ``polyfuse/`` as it is installed (no package-dir
mapping): no top-level ``cuda/`` shadows NVIDIA's ``cuda`` (cuda-bindings), no ``poly/`` loads
as a second copy of ``polyfuse.poly``, and a Python started in the root (a Ray worker puts the
driver's working directory on its path) imports a whole package. tests/conftest.py keeps the
root off sys.path so the tests check the installed copy; this checks it under
``python -m pytest`` (which puts the root there) and ``pytest`` (``python -P``: it does not).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import polyfuse
import polyfuse.cuda

ROOT = Path(__file__).resolve().parents[1]
LAYER_FOLDERS = ("graph", "poly", "stitch", "cuda")


def test_packages_have_one_search_path():
    assert len(polyfuse.__path__) == 1 and Path(polyfuse.__path__[0]).name == "polyfuse"
    assert len(polyfuse.cuda.__path__) == 1


def test_no_checkout_folder_is_importable_by_its_folder_name():
    assert not [p for p in sys.path if Path(p or ".").resolve() == ROOT]
    for name in ("graph", "poly", "stitch"):
        assert importlib.util.find_spec(name) is None, name
    spec = importlib.util.find_spec("cuda")  # NVIDIA's namespace package, when installed
    if spec is not None:
        assert spec.origin != str(ROOT / "cuda" / "__init__.py")
        assert not any(Path(p).resolve() == ROOT / "cuda" for p in spec.submodule_search_locations)
    twins = [
        m for m, mod in list(sys.modules.items())
        if not m.startswith("polyfuse") and m.split(".")[0] in LAYER_FOLDERS
        and any(
            str(getattr(mod, "__file__", "") or "").startswith(str(ROOT / folder))
            for folder in LAYER_FOLDERS
        )
    ]  # fmt: skip
    assert twins == []


def test_cuda_bindings_import_beside_polyfuse_cuda():
    try:
        importlib.metadata.version("cuda-bindings")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("cuda-bindings is not installed")
    import cuda.bindings.driver as drv  # fails where the checkout's cuda/ shadows it

    # not the checkout's cuda/ folder (a virtualenv inside the checkout is fine)
    assert not Path(drv.__file__).resolve().is_relative_to(ROOT / "cuda")


@pytest.mark.parametrize("flags", [["-m", "pytest"], ["-P", "-m", "pytest"]], ids=str)
def test_python_m_pytest_and_pytest_from_the_root_see_the_installed_package(flags):
    """The checks above, in a pytest started from the root both ways (without the
    ``PYTHONSAFEPATH`` tests/conftest.py gives the Pythons the tests start)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    r = subprocess.run(
        [sys.executable, *flags, "-q", "-p", "no:cacheprovider", "tests/test_layout.py",
         "-k", "one_search_path or folder_name or cuda_bindings"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert " passed" in r.stdout


def test_a_python_started_in_the_root_imports_every_layer():
    """CI's slow tier failed here: a non-editable install, and Ray's workers put the driver's
    working directory (the root) first on sys.path; the root's ``polyfuse/`` then lacked the
    layers that pyproject's package-dir mapped in from ``cuda/``, ``poly/`` …, so every worker
    died on ``No module named 'polyfuse.cuda'``. Now the root's ``polyfuse/`` is the whole
    package, whichever copy a Python finds."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    code = (
        "import polyfuse, polyfuse.cuda.emulator, polyfuse.poly.model, polyfuse.stitch.plan, "
        "polyfuse.graph.graph, polyfuse.batch_ray; print(polyfuse.__file__)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert not [p for p in ROOT.iterdir() if p.name in LAYER_FOLDERS]


def test_polyfuse_errors_is_the_user_facing_name_of_base_errors():
    """The layers raise ``polyfuse.base.errors``; users catch ``polyfuse.errors``: every error
    class of the one is the same object in the other."""
    import inspect

    import polyfuse.base.errors as base
    import polyfuse.errors as user

    classes = {
        n for n, v in vars(base).items() if inspect.isclass(v) and issubclass(v, BaseException)
    }
    assert set(user.__all__) == classes
    assert all(getattr(user, n) is getattr(base, n) for n in classes)
