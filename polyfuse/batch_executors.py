"""Running a batch: one process per model ``--jobs`` at a time, or Ray
(:mod:`polyfuse.batch_ray`); progress through :class:`polyfuse.batch_progress.Progress`.

A worker that dies (killed, out of memory) fails its model only; the others finish."""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import multiprocessing.connection as mp_connection
import os
import pickle
import signal
from collections.abc import Callable
from typing import Any

from polyfuse.batch_progress import Progress
from polyfuse.batch_ray import RAY_HINT, run_ray
from polyfuse.batch_task import ModelReport, Task, compile_task
from polyfuse.errors import PolyfuseError

__all__ = ["RAY_HINT", "Progress", "run_batch"]

# --------------------------------------------------------------------------- processes


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


def _run_process(
    tasks: list[Task],
    jobs: int | None,
    progress: Progress,
    on_done: Callable[[int, dict], None],
) -> None:
    """One process per task, at most ``jobs`` (default: the CPU count) at a time.

    A pool would not do: when one of its workers dies (SIGKILL, the OOM killer), a process
    pool breaks and fails every pending task with it. A process of its own per task ties a
    death to exactly one model, which is reported as failed while the others go on.
    """
    # fork: workers start with polyfuse already imported (the parent is single-threaded)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    progress.started(jobs, "process")
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
                progress.running(tasks[i].label)
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


def run_batch(
    tasks: list[Task],
    *,
    jobs: int | None = None,
    executor: str = "process",
    progress: Progress | None = None,
    ray_address: str | None = None,
) -> list[dict[str, Any]]:
    """Compile ``tasks`` in parallel; one report dict per task, in task order. ``jobs``:
    models at once (default: the CPU count, or a Ray cluster's CPUs); ``ray_address``: the
    Ray cluster of ``executor="ray"`` (default ``$RAY_ADDRESS``, else a private local Ray)."""
    prog = progress or Progress(len(tasks), quiet=True)
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
    run = {"process": _run_process, "ray": functools.partial(run_ray, address=ray_address)}
    if executor not in run:
        raise PolyfuseError(f"unknown executor '{executor}': use 'process' or 'ray'")
    try:
        if sub:
            run[executor](sub, jobs, prog, lambda j, rep: on_done(runnable[j], rep))
    finally:
        prog.close()
    return [r for r in reports if r is not None]
