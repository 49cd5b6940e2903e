"""The Ray executor of ``polyfuse zoo``: a private local Ray, or an existing cluster.

Where: ``--ray-address ADDR`` (or ``$RAY_ADDRESS``; ``auto`` included) connects to a running
cluster. A cluster has its own resources, so none are asked for (Ray refuses ``num_cpus`` when
connecting); ``--jobs`` then only caps the models in flight (default: the cluster's CPUs).
Before any model is sent, every node that can take one is checked (:mod:`polyfuse.batch_probe`):
a node without islpy, without polyfuse, or with another polyfuse stops the run with one line
naming the node and what to install. Without an address: a private local Ray with ``--jobs``
CPUs, started and shut down by this run (address ``local``, so a cluster running on this
machine is never joined by accident).

Ray is imported lazily; without it, one line says to ``pip install 'polyfuse[ray]'``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

from polyfuse.batch_progress import Progress
from polyfuse.batch_task import ModelReport, Task, compile_task
from polyfuse.errors import PolyfuseError

__all__ = ["RAY_EPILOG", "RAY_HINT", "ray_address", "run_ray", "check_workers"]

RAY_HINT = "pip install 'polyfuse[ray]'"

log = logging.getLogger(__name__)

#: ``polyfuse zoo --help``'s paragraph on Ray clusters.
RAY_EPILOG = """\
Ray:
  --executor ray alone starts a private local Ray for this run (--jobs CPUs). To compile on
  a running cluster, name its head with --ray-address (or RAY_ADDRESS): HOST:PORT as
  'ray start --head' prints it (port 6379 by default), auto (the cluster started on this
  machine), or ray://HOST:10001 (Ray Client). No resources are requested from a cluster;
  --jobs caps the models in flight (default: its CPUs). A cluster with token authentication
  (the default of 'ray start') also needs RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN,
  or the head's ~/.ray/auth_token) with an explicit address. Every node needs islpy and the
  same polyfuse as this machine: each node is checked before any model is sent, and one
  that lacks them is named with what to install. For example:
    ray start --head --port 6379
    RAY_AUTH_MODE=token polyfuse zoo --size tiny --executor ray --ray-address 127.0.0.1:6379"""

#: Seconds each node has to answer the check before it is reported as not answering.
PROBE_TIMEOUT = 120.0


def ray_address(address: str | None) -> str | None:
    """The cluster to connect to: ``address``, else ``$RAY_ADDRESS``; None: a local Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise PolyfuseError(
            f"--executor ray needs Ray, which is not installed: {RAY_HINT}"
        ) from None
    return ray


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _start_local(ray: Any, jobs: int) -> None:
    """A private Ray on this machine, ``jobs`` CPUs, the cache and import path of this one."""
    env = {"POLYFUSE_CACHE": os.environ.get("POLYFUSE_CACHE", "")}
    path = os.environ.get("PYTHONPATH")
    if path:
        env["PYTHONPATH"] = path
    ray.init(
        address="local",
        num_cpus=jobs,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {k: v for k, v in env.items() if v}},
    )


def _connect(ray: Any, address: str) -> None:
    """Join the cluster at ``address``: no resource arguments (the cluster has its own)."""
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except Exception as e:
        auth = ""
        if address != "auto" and not os.environ.get("RAY_AUTH_MODE"):
            auth = (
                "; a cluster with token authentication (the default of 'ray start') also "
                "needs RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN or ~/.ray/auth_token)"
            )
        raise PolyfuseError(
            f"--executor ray: cannot connect to the Ray cluster at '{address}' ({_one_line(e)})"
            f"{auth}; leave --ray-address and RAY_ADDRESS unset for a private local Ray"
        ) from e


def _cpus(node: dict[str, Any]) -> float:
    return float((node.get("Resources") or {}).get("CPU", 0))


def check_workers(ray: Any, address: str) -> dict[str, Any]:
    """Run :func:`polyfuse.batch_probe.probe` on every alive node with a CPU; raise one
    :class:`PolyfuseError` line naming each node that lacks what the models need. Returns
    the cluster's description (address, nodes, CPUs)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import polyfuse.batch_probe as batch_probe

    nodes = [n for n in ray.nodes() if n.get("Alive") and _cpus(n) >= 1]
    if not nodes:
        raise PolyfuseError(f"the Ray cluster at '{address}' has no alive node with a CPU")
    # by value: the probe must run where polyfuse cannot be imported, to say so
    ray.cloudpickle.register_pickle_by_value(batch_probe)
    remote = ray.remote(num_cpus=0, max_retries=0)(batch_probe.probe)
    refs = {}
    ips = [n.get("NodeManagerAddress", "?") for n in nodes]
    for n, ip in zip(nodes, ips, strict=True):
        name = f"node {ip}" if ips.count(ip) == 1 else f"node {ip} {n['NodeID'][:8]}"
        strategy = NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
        refs[remote.options(scheduling_strategy=strategy).remote()] = name
    _, late = ray.wait(list(refs), num_returns=len(refs), timeout=PROBE_TIMEOUT)
    answers: dict[str, dict[str, Any]] = {}
    for ref, name in refs.items():
        if ref in late:
            answers[name] = {"error": f"no answer to the check in {PROBE_TIMEOUT:g} s"}
            ray.cancel(ref, force=True)
            continue
        try:
            answers[name] = ray.get(ref)
        except Exception as e:
            answers[name] = {"error": f"the check could not run there ({_one_line(e)})"}
    for name, a in answers.items():
        log.info("Ray %s: %s", name, a)
    bad = batch_probe.problems(answers, batch_probe.probe())
    if bad:
        raise PolyfuseError(f"Ray cluster '{address}': {'; '.join(bad)}")
    cpus = int(sum(_cpus(n) for n in nodes))
    return {"address": address, "nodes": len(nodes), "cpus": cpus}


def run_ray(
    tasks: list[Task],
    jobs: int | None,
    progress: Progress,
    on_done: Callable[[int, dict], None],
    address: str | None = None,
) -> None:
    """Compile ``tasks`` as Ray tasks, at most ``jobs`` in flight; see the module doc."""
    ray = _import_ray()
    address = ray_address(address)
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            _connect(ray, address)
        else:
            _start_local(ray, max(1, min(jobs or os.cpu_count() or 1, len(tasks))))
    try:
        if address:
            where = check_workers(ray, address)
            jobs = jobs or where["cpus"]
            nodes = f"{where['nodes']} node{'s' if where['nodes'] != 1 else ''}"
            what = f"ray (cluster {address}, {nodes})"
        else:
            jobs = jobs or os.cpu_count() or 1
            where = {"address": "local"}
            what = "ray (local)"
        jobs = max(1, min(jobs, len(tasks)))
        progress.started(jobs, what, where)
        _run(ray, tasks, jobs, progress, on_done)
    finally:
        if started_here:
            ray.shutdown()


def _run(
    ray: Any, tasks: list[Task], jobs: int, progress: Progress, on_done: Callable[[int, dict], None]
) -> None:
    """Submit up to ``jobs`` tasks at a time; report each as it ends."""
    remote = ray.remote(num_cpus=1, max_retries=0)(compile_task)
    queue = list(range(len(tasks)))[::-1]
    inflight: dict[Any, int] = {}
    try:
        while queue or inflight:
            while queue and len(inflight) < jobs:
                i = queue.pop()
                inflight[remote.remote(tasks[i])] = i
                progress.running(tasks[i].label)
            ready, _ = ray.wait(list(inflight), num_returns=1)
            i = inflight.pop(ready[0])
            try:
                rep = ray.get(ready[0])
            except Exception as e:  # the worker died, or could not run the task
                reason = f"worker died: {_one_line(e)}"
                rep = dataclasses.asdict(ModelReport(tasks[i].label, tasks[i].spec, reason=reason))
            on_done(i, rep)
    finally:
        for ref in inflight:  # interrupted: do not leave models compiling on the cluster
            ray.cancel(ref, force=True)
