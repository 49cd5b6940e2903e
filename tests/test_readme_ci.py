"""CI runs what the README tells a newcomer to run, and nothing in between.

The README opens with two commands (install + main job, then the fast tier). A green CI must
mean a newcomer's green run, so ``.ci/run`` runs exactly those two lines first, with no
install step between them, and the fast tier must pass with only what command 1 installs:
tests that need an optional extra (PyTorch, a browser) skip without it, and ``.ci/run``
installs the extras only afterwards and runs those tests by name.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / ".ci" / "run"


def readme_commands() -> list[str]:
    """The commands of the README's first code block."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "the README opens with a bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def ci_commands() -> list[str]:
    """The lines of .ci/run that run something (not comments, echo, set, cd, export, rm)."""
    skip = ("#", "echo ", "set ", "cd ", "export ", "rm ", "if ", "fi", "then", "else")
    lines = [s.strip() for s in CI.read_text().splitlines()]
    return [s for s in lines if s and not s.startswith(skip) and not s.startswith("#!")]


def test_readme_opens_with_exactly_two_commands():
    text = (ROOT / "README.md").read_text()
    assert text.index("```bash") < text.index("\n## "), "the commands come first"
    cmds = readme_commands()
    assert len(cmds) == 2, cmds
    assert "pip install" in cmds[0] and "polyfuse demo" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_commands_first_and_nothing_between():
    cmds, ci = readme_commands(), ci_commands()
    assert ci[:2] == cmds, f".ci/run must start with the README's commands, got {ci[:2]}"


def _extra_tests() -> set[str]:
    m = re.search(r'^EXTRA_TESTS="([^"]*)"', CI.read_text(), re.M)
    assert m, ".ci/run names the tests that need optional extras in EXTRA_TESTS"
    return set(m.group(1).split())


def test_every_test_that_needs_an_extra_runs_after_the_extras_are_installed():
    needs = set()
    for f in sorted((ROOT / "tests").glob("test_*.py")):
        if f.name == Path(__file__).name:
            continue
        src = f.read_text()
        if re.search(r"importorskip\(\s*[\"']torch[\"']", src) or "chromedriver" in src:
            needs.add(f"tests/{f.name}")
    assert needs <= _extra_tests(), f"add to EXTRA_TESTS in .ci/run: {needs - _extra_tests()}"
    assert all((ROOT / t).exists() for t in _extra_tests())


def test_the_extras_step_runs_the_marked_tests_and_whole_modules_are_marked():
    """.ci/run's extras step selects ``-m "extra and not slow"`` (conftest.py fails a test
    that skips for a missing extra without the mark); a module that skips as a whole at import
    (``importorskip`` at top level) has no test to fail, so it must carry the mark itself."""
    assert re.search(r'pytest -q -m "extra and not slow" \$EXTRA_TESTS', CI.read_text())
    for t in sorted(_extra_tests()):
        src = (ROOT / t).read_text()
        if re.search(r"^\w+ = pytest\.importorskip\(\s*[\"']torch", src, re.M):
            assert re.search(r"^pytestmark = .*pytest\.mark\.extra", src, re.M), (
                f"{t} skips as a whole without torch: give it pytestmark = pytest.mark.extra"
            )


@pytest.mark.slow  # 25 s of collection in subprocesses; CI's fast tier runs without torch anyway
def test_fast_tier_collects_and_checks_imports_without_torch():
    """With torch unimportable (the README's commands do not install it), the test modules
    that mention torch are collected and the import-graph test passes (it used to import
    polyfuse.torch, which imports torch)."""
    code = (
        "import sys; sys.modules['torch'] = None; import pytest; "
        "sys.exit(pytest.main(['-q', '-n', '0', '-p', 'no:cacheprovider', "
        "'tests/test_import_graph.py', 'tests/test_packaging.py']))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    mention = [
        f"tests/{f.name}"
        for f in sorted((ROOT / "tests").glob("test_*.py"))
        if "torch" in f.read_text() and f"tests/{f.name}" not in _extra_tests()
    ]
    code = (
        "import sys; sys.modules['torch'] = None; import pytest; "
        "sys.exit(pytest.main(['-q', '-n', '0', '--collect-only', '-p', 'no:cacheprovider', "
        f"*{mention}]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_a_test_that_skips_for_a_missing_extra_without_the_mark_fails(tmp_path):
    """conftest.py turns such a skip into a failure (CI's extras step would never run it); with
    the mark it stays a skip."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_needs_torch.py").write_text(
        "import sys\nimport pytest\n\n"
        "def test_unmarked():\n"
        "    sys.modules['torch'] = None\n"
        "    pytest.importorskip('torch')\n\n"
        "@pytest.mark.extra\n"
        "def test_marked():\n"
        "    sys.modules['torch'] = None\n"
        "    pytest.importorskip('torch')\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 1, r.stdout[-2000:]
    assert "1 failed, 1 skipped" in r.stdout, r.stdout[-2000:]
    assert "test_unmarked skips for a missing optional extra" in r.stdout, r.stdout[-2000:]
