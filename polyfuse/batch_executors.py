"""Running a batch: one process per model ``--jobs`` at a time, or Ray; a progress bar.

A worker that dies (killed, out of memory) fails its model only; the others finish."""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.connection as mp_connection
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from polyfuse.batch_task import ModelReport, Task, compile_task
from polyfuse.errors import PolyfuseError

RAY_HINT = "pip install 'polyfuse[ray]'"

# --------------------------------------------------------------------------- executors, progress


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, one line per model otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()

    def _bar(self) -> str:
        width = 24
        fill = width * self.done // max(self.total, 1)
        failed = f", {self.failed} failed" if self.failed else ""
        return (
            f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total}{failed} "
            f"{time.perf_counter() - self.start:.1f} s"
        )

    def started(self, n_workers: int, executor: str) -> None:
        if not self.quiet:
            print(
                f"polyfuse zoo: {self.total} models, {n_workers} {executor} workers",
                file=self.stream,
                flush=True,
            )

    def finished(self, rep: dict[str, Any]) -> None:
        self.done += 1
        self.failed += rep["status"] != "ok"
        if self.quiet:
            return
        if rep["status"] == "ok":
            cached = " (cached)" if rep["model_cache"] == "hit" else ""
            what = f"ok, {rep['kernels']} kernels, {rep['total_seconds']:.1f} s{cached}"
        else:
            what = f"FAILED: {rep['reason']}"
        line = f"{rep['name']}: {what}"
        if self.tty:
            print(f"\r\x1b[K  {line}\n{self._bar()}", end="", file=self.stream, flush=True)
            if self.done == self.total:
                print(file=self.stream, flush=True)
        else:
            print(f"{self._bar()} {line}", file=self.stream, flush=True)


def _task_main(task: Task, conn: Any) -> None:
    """A worker process: compile one task and send its report to the parent."""
    conn.send(compile_task(task))
    conn.close()


def _died(task: Task, exitcode: int | None) -> dict[str, Any]:
    """The report of a task whose worker process ended without sending one."""
    if exitcode is not None and exitcode < 0:
        how = f"was killed by {signal.Signals(-exitcode).name}"
        if -exitcode == signal.SIGKILL:
            how += " (out of memory, or killed by hand)"
    else:
        how = f"exited with status {exitcode} without a report"
    reason = f"worker died: the process compiling '{task.label}' {how}; the other models went on"
    return dataclasses.asdict(ModelReport(task.label, task.spec, reason=reason))


def _run_process(tasks: list[Task], jobs: int, on_done: Callable[[int, dict], None]) -> None:
    """One process per task, at most ``jobs`` at a time.

    A pool would not do: when one of its workers dies (SIGKILL, the OOM killer), a process
    pool breaks and fails every pending task with it. A process of its own per task ties a
    death to exactly one model, which is reported as failed while the others go on.
    """
    # fork: workers start with polyfuse already imported (the parent is single-threaded)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    queue = list(range(len(tasks)))[::-1]
    running: dict[Any, tuple[int, Any]] = {}  # receiving end of the pipe -> (task, process)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                i = queue.pop()
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_task_main, args=(tasks[i], send), name=tasks[i].label)
                proc.start()
                send.close()  # the parent keeps no write end: a dead worker reads as EOF
                running[recv] = (i, proc)
            for recv in mp_connection.wait(list(running)):
                i, proc = running.pop(recv)
                try:
                    rep = recv.recv()
                except (EOFError, OSError, ValueError, pickle.UnpicklingError):
                    rep = None  # died before (or while) sending its report
                recv.close()
                proc.join()
                on_done(i, rep if isinstance(rep, dict) else _died(tasks[i], proc.exitcode))
    finally:
        for recv, (_, proc) in running.items():  # interrupted: stop the workers still running
            proc.kill()
            proc.join()
            recv.close()


def _run_ray(tasks: list[Task], jobs: int, on_done: Callable[[int, dict], None]) -> None:
    try:
        import ray
    except ImportError:
        raise PolyfuseError(
            f"--executor ray needs Ray, which is not installed: {RAY_HINT}"
        ) from None
    started_here = not ray.is_initialized()
    if started_here:
        env = {"POLYFUSE_CACHE": os.environ.get("POLYFUSE_CACHE", "")}
        path = os.environ.get("PYTHONPATH")
        if path:
            env["PYTHONPATH"] = path
        ray.init(
            num_cpus=jobs,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": {k: v for k, v in env.items() if v}},
        )
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(compile_task)
        refs = {remote.remote(t): i for i, t in enumerate(tasks)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            i = refs[ready[0]]
            try:
                rep = ray.get(ready[0])
            except Exception as e:  # the worker died
                rep = dataclasses.asdict(
                    ModelReport(tasks[i].label, tasks[i].spec, reason=f"worker died: {e}")
                )
            on_done(i, rep)
    finally:
        if started_here:
            ray.shutdown()


def run_batch(
    tasks: list[Task],
    *,
    jobs: int | None = None,
    executor: str = "process",
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Compile ``tasks`` in parallel; one report dict per task, in task order."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks) or 1))
    prog = progress or Progress(len(tasks), quiet=True)
    prog.started(jobs, executor)
    reports: list[dict[str, Any] | None] = [None] * len(tasks)

    def on_done(i: int, rep: dict[str, Any]) -> None:
        reports[i] = rep
        prog.finished(rep)

    # arguments that name nothing are reported without a worker
    runnable = []
    for i, t in enumerate(tasks):
        if t.kind == "invalid":
            on_done(i, compile_task(t))
        else:
            runnable.append(i)
    sub = [tasks[i] for i in runnable]
    if sub:
        run = {"process": _run_process, "ray": _run_ray}.get(executor)
        if run is None:
            raise PolyfuseError(f"unknown executor '{executor}': use 'process' or 'ray'")
        run(sub, jobs, lambda j, rep: on_done(runnable[j], rep))
    return [r for r in reports if r is not None]
