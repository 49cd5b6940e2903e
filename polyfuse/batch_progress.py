"""The progress of a ``polyfuse zoo`` batch on stderr, drawn with tqdm.

On a terminal: one bar redrawn in place (models done of total, failures, elapsed time, the
ETA tqdm estimates from the rate so far, and the models still running), with a line per
finished model printed above it. Elsewhere (a log file, CI): one line per finished model with
the same figures, so a log shows when each model ended and what was still running then.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["Progress"]

#: How many running models the progress line names before "+N more".
_SHOWN = 4


class Progress:
    """Observer of a batch: the executor calls :meth:`started`, then :meth:`running` and
    :meth:`finished` per model; ``workers`` and ``where`` keep what :meth:`started` said."""

    def __init__(self, total: int, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()
        self.active: list[str] = []  # labels of the models running now, in start order
        self.workers = 0
        self.where: dict[str, Any] = {}
        self._bar: tqdm | None = None

    # ------------------------------------------------------------------ executor callbacks
    def started(self, n_workers: int, executor: str, where: dict[str, Any] | None = None) -> None:
        """The executor runs ``n_workers`` models at once; ``where`` describes it (Ray)."""
        self.workers, self.where = n_workers, dict(where or {})
        self.start = time.perf_counter()
        if self.quiet:
            return
        print(
            f"polyfuse zoo: {self.total} models, {n_workers} {executor} workers",
            file=self.stream,
            flush=True,
        )
        if self.tty:
            self._bar = tqdm(
                total=self.total,
                file=self.stream,
                unit="model",
                dynamic_ncols=True,
                leave=True,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}",
            )

    def running(self, label: str) -> None:
        """A model started compiling."""
        self.active.append(label)
        if self._bar is not None:
            self._bar.set_postfix_str(self._running(), refresh=True)

    def finished(self, rep: dict[str, Any]) -> None:
        """A model ended (its report)."""
        self.done += 1
        self.failed += rep["status"] != "ok"
        if rep["name"] in self.active:
            self.active.remove(rep["name"])
        if self.quiet:
            return
        if rep["status"] == "ok":
            cached = " (cached)" if rep["model_cache"] == "hit" else ""
            what = f"ok, {rep['kernels']} kernels, {rep['total_seconds']:.1f} s{cached}"
        else:
            what = f"FAILED: {rep['reason']}"
        line = f"{rep['name']}: {what}"
        if self._bar is not None:
            self._bar.write(f"  {line}", file=self.stream)
            self._bar.set_description_str(self._failures(), refresh=False)
            self._bar.set_postfix_str(self._running(), refresh=False)
            self._bar.update(1)
            self._bar.refresh()  # now, not at tqdm's next interval: a model just ended
            if self.done == self.total:
                self.close()
            return
        meter = tqdm.format_meter(
            self.done,
            self.total,
            time.perf_counter() - self.start,
            bar_format="{n_fmt}/{total_fmt} {elapsed}<{remaining}",
        )
        running = f"; {self._running()}" if self.active else ""
        print(f"[{meter}{self._failures(', ')}] {line}{running}", file=self.stream, flush=True)

    def close(self) -> None:
        """End the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ------------------------------------------------------------------ text
    def _running(self) -> str:
        if not self.active:
            return ""
        names = ", ".join(self.active[:_SHOWN])
        more = f" +{len(self.active) - _SHOWN} more" if len(self.active) > _SHOWN else ""
        return f"running: {names}{more}"

    def _failures(self, sep: str = "") -> str:
        return f"{sep}{self.failed} failed" if self.failed else ""
