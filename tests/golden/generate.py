"""Write the generated CUDA of every example, suite subgraph, test case and tiny zoo model.

The goldens pin the compiler's output byte for byte across refactors that must not change
behaviour (issue 11: lowering as passes over a kernel IR). Rerun after an intended change:

    python tests/golden/generate.py            # all graphs
    python tests/golden/generate.py softmax    # only goldens whose name contains 'softmax'

Compiles without the CUDA check and without a cache, so the text depends on the code only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (ROOT / "benchmarks", ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

SUITE_SCALE = 16  # the scale tests/test_benchmark_suite.py compiles at (reduced axes kept)

# name -> () -> (inputs, outputs, constants)
Graph = Callable[[], tuple[list, list, dict]]


def graphs(tiny_zoo: bool = True) -> Iterator[tuple[str, Graph]]:
    """Every golden graph, by a stable file-name-safe name."""
    import suite
    from cases import build_cases

    from polyfuse import zoo
    from polyfuse.examples import EXAMPLES

    for name, ex in EXAMPLES.items():
        yield f"example_{name}", lambda ex=ex: (*ex.build()[:2], {})
    for name in suite.NAMES:
        yield f"suite_{name}", lambda name=name: (*suite.build(name, SUITE_SCALE)[:2], {})
    for case in build_cases():  # rebuilt per graph: names then do not depend on the order
        yield f"case_{case.name}", lambda name=case.name: _case(name)
    if tiny_zoo:
        for name in zoo.MODELS:
            yield f"zoo_{name}", lambda name=name: _zoo(name)


def _case(name: str) -> tuple[list, list, dict]:
    from cases import build_cases

    (case,) = [c for c in build_cases() if c.name == name]
    return case.inputs, case.outputs, {}


def _zoo(name: str) -> tuple[list, list, dict]:
    from polyfuse import zoo

    m = zoo.build(name, "tiny", weights="zeros")
    return m.inputs, m.outputs, m.constants


def fresh_names() -> None:
    """Restart the default-name counters of ``ops`` and ``te`` (``mul0``, ``k0``, ...), so a
    graph's generated names do not depend on what the process built before it."""
    import itertools

    from polyfuse import te
    from polyfuse.ops import _common

    _common._counter = itertools.count()
    te._names = itertools.count()


def cuda_of(name: str, graph: Graph) -> str:
    """The CUDA translation unit the compiler generates for ``graph``."""
    import polyfuse

    fresh_names()
    inputs, outputs, constants = graph()
    fn = polyfuse.compile(
        inputs, outputs, constants=constants, check_cuda=False, cache=None, name=name
    )
    return fn.cuda_source


def path_of(name: str) -> Path:
    return HERE / f"{name}.cu"


def main(argv: list[str]) -> int:
    for name, graph in graphs():
        if argv and not any(a in name for a in argv):
            continue
        path_of(name).write_text(cuda_of(name, graph))
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
