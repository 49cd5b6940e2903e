"""Count the kernel notes of every golden graph that are decision records vs plain text.

Issue 21 item 4: every choice a plan shows as a note is a :class:`DecisionNote` (its text is
the record's reason); only measurements (the SASS instrument, the cost model's figures) stay
plain text. Prints the totals and the plain notes grouped by their first words:

    python benchmarks/note_records.py          # all golden graphs
    python benchmarks/note_records.py -v       # and every plain note's text
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "golden"))


def _shape(note: str) -> str:
    """A plain note's category: its text with names and numbers blurred, first words."""
    text = re.sub(r"^[\w.]+: ", "<k>: ", note)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return " ".join(text.split()[:5])


def main(argv: list[str]) -> int:
    import generate

    import polyfuse
    from polyfuse.base.decision import DecisionNote

    records = plain = 0
    shapes: Counter[str] = Counter()
    texts: list[str] = []
    for name, graph in generate.graphs():
        generate.fresh_names()
        inputs, outputs, constants = graph()
        fn = polyfuse.compile(
            inputs, outputs, constants=constants, check_cuda=False, cache=None, name=name
        )
        for k in fn.kernels:
            for n in k.notes:
                if isinstance(n, DecisionNote):
                    records += 1
                else:
                    plain += 1
                    shapes[_shape(n)] += 1
                    texts.append(f"{name}: {n}")
    print(f"{records} of {records + plain} kernel notes are decision records, {plain} plain")
    for shape, count in shapes.most_common():
        print(f"{count:5d}  {shape}")
    if "-v" in argv:
        print("\n".join(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
