"""``polyfuse zoo --executor ray`` on an existing Ray cluster (polyfuse/batch_ray.py).

Fast tier: a stand-in ``ray`` module records how Ray is started or joined (an address means no
resource arguments; none means a private local Ray, never a cluster found by accident) and
answers the worker check; :mod:`polyfuse.batch_probe` is exercised where polyfuse cannot be
imported. Slow tier: a real head node (``ray start --head --block`` in a temporary directory,
ports of its own, token authentication with a token of its own), the tiny zoo compiled on it
through the CLI with ``--ray-address`` and with ``RAY_ADDRESS``, then a run whose workers lack
islpy (a job runtime environment that hides it) refused with one line naming the node; the
head is stopped (SIGTERM to its process group) in a ``finally``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pytest

import polyfuse
from polyfuse import batch_probe, zoo
from polyfuse.cli import main

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- a stand-in ray


class _Ref:
    def __init__(self, fn, args, node: str | None):
        self.fn, self.args, self.node = fn, args, node


class _Remote:
    def __init__(self, fake: FakeRay, fn, node: str | None = None):
        self.fake, self.fn, self.node = fake, fn, node

    def options(self, scheduling_strategy=None, **_: Any) -> _Remote:
        return _Remote(self.fake, self.fn, scheduling_strategy.node_id)

    def remote(self, *args: Any) -> _Ref:
        return _Ref(self.fn, args, self.node)


class FakeRay(types.ModuleType):
    """Enough of ``ray`` for polyfuse.batch_ray: tasks run in this process when fetched;
    ``broken`` maps a node id to what its worker lacks (the probe's answer is edited)."""

    def __init__(self, nodes: int = 2) -> None:
        super().__init__("ray")
        self.inits: list[dict[str, Any]] = []
        self.shutdowns = 0
        self.broken: dict[str, dict[str, Any]] = {}
        self.node_list = [
            {"NodeID": f"{i:02d}" * 28, "Alive": True, "NodeManagerAddress": f"10.0.0.{i + 1}",
             "Resources": {"CPU": 2.0}}
            for i in range(nodes)
        ]  # fmt: skip
        self.cloudpickle = types.SimpleNamespace(register_pickle_by_value=self._by_value)
        self.by_value: list[str] = []
        self._init = False

    def _by_value(self, module: types.ModuleType) -> None:
        self.by_value.append(module.__name__)

    def init(self, **kwargs: Any) -> None:
        self.inits.append(kwargs)
        self._init = True

    def is_initialized(self) -> bool:
        return self._init

    def shutdown(self) -> None:
        self.shutdowns += 1
        self._init = False

    def nodes(self) -> list[dict[str, Any]]:
        return self.node_list

    def remote(self, **_: Any):
        return lambda fn: _Remote(self, fn)

    def wait(self, refs, num_returns=1, timeout=None):
        return list(refs)[:num_returns], list(refs)[num_returns:]

    def get(self, ref: _Ref) -> Any:
        out = ref.fn(*ref.args)
        if ref.node in self.broken:
            out = {**out, **self.broken[ref.node]}
        return out

    def cancel(self, ref: _Ref, force: bool = False) -> None:
        pass


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    fake = FakeRay()
    strategies = types.ModuleType("ray.util.scheduling_strategies")
    strategies.NodeAffinitySchedulingStrategy = lambda node_id, soft: types.SimpleNamespace(
        node_id=node_id, soft=soft
    )
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray.util", types.ModuleType("ray.util"))
    monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", strategies)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return fake


def _zoo_ray(tmp_path: Path, *extra: str) -> list[str]:
    return ["zoo", "softmax", "--size", "tiny", "--executor", "ray", "--no-cuda-check",
            "--cache-dir", str(tmp_path), *extra]  # fmt: skip


_RESOURCE_ARGS = {"num_cpus", "num_gpus", "resources", "object_store_memory", "include_dashboard"}


def test_ray_address_joins_the_cluster_without_resource_arguments(fake_ray, tmp_path, capsys):
    assert main([*_zoo_ray(tmp_path, "--ray-address", "10.0.0.1:6379"), "--json", "-"]) == 0
    (init,) = fake_ray.inits
    assert init["address"] == "10.0.0.1:6379" and not _RESOURCE_ARGS & set(init)
    doc = json.loads(capsys.readouterr().out)
    assert doc["ray"] == {"address": "10.0.0.1:6379", "nodes": 2, "cpus": 4}
    assert doc["jobs"] == 1 and [m["status"] for m in doc["models"]] == ["ok"]
    assert fake_ray.by_value == ["polyfuse.batch_probe"]  # the check runs without polyfuse
    assert fake_ray.shutdowns == 1


@pytest.mark.parametrize("address", ["auto", "10.0.0.1:6379"])
def test_ray_address_environment_variable(fake_ray, tmp_path, monkeypatch, address):
    monkeypatch.setenv("RAY_ADDRESS", address)
    assert main(_zoo_ray(tmp_path, "-q")) == 0
    (init,) = fake_ray.inits
    assert init["address"] == address and not _RESOURCE_ARGS & set(init)


def test_without_an_address_a_private_local_ray(fake_ray, tmp_path):
    """address="local": a cluster running on this machine is never joined by accident."""
    assert main(_zoo_ray(tmp_path, "-q", "--jobs", "3")) == 0
    (init,) = fake_ray.inits
    assert init["address"] == "local" and init["num_cpus"] == 1  # one model: one CPU
    assert fake_ray.by_value == []  # this machine's own environment: nothing to check


def test_a_worker_without_islpy_is_named_in_one_line(fake_ray, tmp_path, capsys):
    bad = fake_ray.node_list[1]["NodeID"]
    missing = "ModuleNotFoundError: No module named 'islpy'"
    fake_ray.broken[bad] = {"islpy": None, "islpy_error": missing}
    assert main(_zoo_ray(tmp_path, "--ray-address", "10.0.0.1:6379")) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("polyfuse: error: Ray cluster '10.0.0.1:6379': worker on node 10.0.0.2")
    assert "islpy is missing" in line and "pip install islpy" in line
    assert "10.0.0.1 " not in line and "Traceback" not in captured.err
    assert captured.out == ""  # no model was sent


def test_a_worker_with_another_polyfuse_is_named(fake_ray, tmp_path, capsys):
    fake_ray.broken[fake_ray.node_list[0]["NodeID"]] = {"polyfuse": "0.0.1"}
    assert main(_zoo_ray(tmp_path, "--ray-address", "10.0.0.1:6379")) == 2
    err = capsys.readouterr().err
    assert f"worker on node 10.0.0.1 ({socket.gethostname()}): it runs polyfuse 0.0.1" in err
    assert f"install polyfuse {polyfuse.__version__} there" in err


def test_ray_address_needs_the_ray_executor(tmp_path, capsys):
    assert main(["zoo", "softmax", "--ray-address", "auto", "--cache-dir", str(tmp_path)]) == 2
    assert "--ray-address needs --executor ray" in capsys.readouterr().err


def test_problems_per_node():
    here = {"polyfuse": "1.0", "digest": "abc", "islpy": "2025.1"}
    ok = {"host": "h", "polyfuse": "1.0", "digest": "abc", "islpy": "2025.2"}
    assert batch_probe.problems({"node a": ok}, here) == []
    got = batch_probe.problems(
        {
            "node a": ok,
            "node b": {**ok, "digest": "xyz"},
            "node c": {"host": "hc", "islpy": None, "islpy_error": "ImportError: no islpy",
                       "polyfuse": None, "polyfuse_error": "ImportError: no islpy"},
            "node d": {"error": "no answer to the check in 120 s"},
        },
        here,
    )  # fmt: skip
    assert got == [
        "worker on node b (h): its polyfuse 1.0 is built from other sources (compiler digest "
        "xyz, here abc): install the same polyfuse",
        "worker on node c (hc): islpy is missing (ImportError: no islpy): pip install islpy",
        "worker on node d: no answer to the check in 120 s",
    ]


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_probe_travels_by_value_and_runs_without_polyfuse(tmp_path):
    """Pickled as Ray pickles it, the check runs where neither polyfuse nor islpy imports."""
    import ray.cloudpickle as cloudpickle

    cloudpickle.register_pickle_by_value(batch_probe)
    try:
        blob = cloudpickle.dumps(batch_probe.probe)
    finally:
        cloudpickle.unregister_pickle_by_value(batch_probe)
    (tmp_path / "probe.pkl").write_bytes(blob)
    script = textwrap.dedent(
        """
        import json, pickle, sys
        sys.modules["polyfuse"] = None  # import polyfuse -> ImportError
        sys.modules["islpy"] = None
        print(json.dumps(pickle.loads(open(sys.argv[1], "rb").read())()))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "probe.pkl")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["polyfuse"] is None and answer["islpy"] is None
    assert "import of islpy halted" in answer["islpy_error"]
    (line,) = batch_probe.problems({"node x": answer}, batch_probe.probe())
    assert "islpy is missing" in line and "pip install islpy" in line
    assert "polyfuse cannot be imported" in line and polyfuse.__version__ in line


# --------------------------------------------------------------------------- a real cluster


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_for_head(proc: subprocess.Popen, port: int, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"ray start exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if "This command will now block" in log.read_text():
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
        time.sleep(0.5)
    pytest.fail(f"the Ray head did not start in {timeout} s:\n{log.read_text()[-3000:]}")


def _stop_head(proc: subprocess.Popen) -> None:
    """SIGTERM to the head's process group (its own session): ``ray start --block`` drains
    and stops every process of this cluster, and no other cluster on the machine."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    try:  # stragglers of the group (workers) once the head command is gone
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polyfuse", *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=cwd,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_tiny_zoo_on_a_ray_cluster_through_the_cli(tmp_path):
    # a short folder: Ray's unix socket paths live under --temp-dir (108-byte limit)
    temp = Path(tempfile.mkdtemp(prefix="pfray", dir="/tmp"))
    gcs, nm, om, dash, agent, grpc, metrics, renv = _free_ports(8)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # token authentication, as 'ray start' does by default, with this test's own token
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    env["POLYFUSE_CACHE"] = str(tmp_path / "cache")
    log = temp / "head.log"
    head = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
        f"--port={gcs}", f"--temp-dir={temp}", "--num-cpus=2", "--include-dashboard=false",
        "--disable-usage-stats", f"--node-manager-port={nm}", f"--object-manager-port={om}",
        f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={grpc}", f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={renv}",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(
            head, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        _wait_for_head(proc, gcs, log)
        address = f"127.0.0.1:{gcs}"
        common = ["zoo", "--size", "tiny", "--executor", "ray", "--no-cuda-check", "--json", "-"]
        cache = ["--cache-dir", str(tmp_path / "zoo-cache")]

        run = _cli([*common, *cache, "--ray-address", address], env, tmp_path)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "Traceback" not in run.stderr
        doc = json.loads(run.stdout)  # stdout is the JSON report alone
        assert [m["name"] for m in doc["models"]] == list(zoo.MODELS)
        assert all(m["status"] == "ok" and m["kernels"] >= 1 for m in doc["models"])
        assert doc["executor"] == "ray" and doc["ray"]["address"] == address
        assert doc["ray"]["nodes"] == 1 and doc["ray"]["cpus"] == 2 and doc["jobs"] == 2
        assert f"ray (cluster {address}, 1 node) workers" in run.stderr

        # RAY_ADDRESS instead of --ray-address; warm: the model cache the workers wrote
        run = _cli([*common, *cache, "deepfm"], {**env, "RAY_ADDRESS": address}, tmp_path)
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(run.stdout)["models"][0]["model_cache"] == "hit"

        # workers without islpy (a job runtime environment hides it): refused, one line
        shim = tmp_path / "shim" / "islpy"
        shim.mkdir(parents=True)
        (shim / "__init__.py").write_text("raise ImportError('islpy hidden by the test')\n")
        job = {"runtime_env": {"env_vars": {"PYTHONPATH": str(shim.parent)}}}
        run = _cli(
            [*common, *cache, "deepfm", "--ray-address", address],
            {**env, "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(job)},
            tmp_path,
        )
        assert run.returncode == 2 and run.stdout == ""
        (line,) = [ln for ln in run.stderr.splitlines() if ln.startswith("polyfuse")]
        assert line.startswith(f"polyfuse: error: Ray cluster '{address}': worker on node ")
        assert "islpy is missing (ImportError: islpy hidden by the test): pip install islpy" in line
        assert "Traceback" not in run.stderr
    finally:
        _stop_head(proc)
        shutil.rmtree(temp, ignore_errors=True)
