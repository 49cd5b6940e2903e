"""A GPU day in two commands: everything a lent GPU should run, prepared here and run there in
one call under the lease's ten-minute limit.

``python benchmarks/gpu.py --prepare-all DIR [--arch sm_90] [--python 3.12]``
    (here, with polyfuse and network access to PyPI) compiles every benchmark case into
    ``DIR/cases`` (``--prepare``), builds a wheel of polyfuse and downloads an islpy wheel
    for the GPU machine's Python into ``DIR/wheels`` (that machine has no islpy and no
    network; ``--models`` and ``tests/test_gpu.py`` compile there), and writes ``DIR/day.json``.
    ``DIR`` stays under 60 MiB.
``python benchmarks/gpu.py --all DIR [--out FILE] [--budget-s 540]``
    (there, from the repository root) installs the carried wheels into ``DIR/site`` when islpy
    is missing, then runs the steps below one after another, each in its own process with a
    time limit cut to what is left of the budget (a step that overruns is stopped and reported;
    the others still run): ``run`` (``--run``: ceilings, then every case checked against
    float64 and timed beside torch eager, torch.compile and JAX), ``overhead``
    (``--overhead``), ``tune`` (``--tune``: the top GEMM tilings timed beside their modelled
    times), ``tests`` (``pytest tests/test_gpu.py``: the runtime against the
    emulator on hardware) and ``models`` (``--models``: whole zoo models). It writes one JSON
    (default ``DIR/results/gpu_day.json``) and prints one table of steps and figures last.

``--fake-driver`` runs ``--all`` on tests/fake_cuda.py's driver (kernels in the CPU emulator,
nothing timed, the steps that need torch on a GPU skipped): CI exercises the day's plumbing
with it (tests/test_gpu_benchmark.py).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpu_artifacts import ROOT, _commit, prepare
from gpu_cases import CASES
from gpu_measure import over_launch

DAY = "day.json"
PYTEST_ARGS = ("-q", "-rs", "-p", "no:cacheprovider")
#: The tests that need the GPU: the runtime against the emulator, the tensor-core kernels.
GPU_TESTS = ("tests/test_gpu.py", "tests/test_gpu_tensor_cores.py")
#: Every step of the day, in the order it runs (``--steps`` picks some).
STEPS = ("run", "overhead", "tune", "tests", "models")
DAY_FORMAT = 1
#: The most DIR may weigh: it travels with the working tree to the GPU machine.
MAX_BYTES = 60 * 1024 * 1024
#: The manylinux tags pip may take a wheel for (the GPU machine is x86-64 Linux).
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


@dataclass
class Step:
    """One step of the day: a command, its time limit, and what became of it."""

    name: str
    argv: list[str]
    limit_s: float
    status: str = "not run"  # ok | failed (rc N) | timed out | skipped: why
    seconds: float = 0.0
    summary: str = ""
    log: str = ""


@dataclass
class Day:
    """What ``--all`` measured: the steps and the figures their JSON files hold."""

    directory: str
    commit: str
    prepared_commit: str
    steps: list[Step] = field(default_factory=list)
    run: dict[str, Any] | None = None
    overhead: dict[str, float] | None = None
    models: dict[str, Any] | None = None
    tune: dict[str, Any] | None = None


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False
    )


def _source_tree(dest: Path, root: Path = ROOT) -> Path:
    """A copy of the project's files (those git tracks, or the tree less build outputs and
    environments) in ``dest``: the wheel is built from it, so no stale ``build/`` left by an
    earlier build (a module deleted since) can reach the GPU machine, and the checkout gets
    no ``build/`` of its own."""
    tracked = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=False
    )
    if tracked.returncode == 0 and tracked.stdout:
        for rel in tracked.stdout.decode().split("\0"):
            src = root / rel
            if rel and src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
    else:
        junk = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__")
        shutil.copytree(root, dest, ignore=junk, dirs_exist_ok=True)
    return dest


def build_wheel(wdir: Path, root: Path = ROOT) -> subprocess.CompletedProcess:
    """Build the polyfuse wheel of ``root`` into ``wdir`` from a clean copy of its files."""
    with tempfile.TemporaryDirectory(prefix="polyfuse-wheel-") as tmp:
        src = _source_tree(Path(tmp) / "src", root)
        return _pip(
            "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wdir.resolve()), str(src)
        )  # fmt: skip


def _dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def prepare_all(
    directory: Path,
    arch: str = "sm_90",
    python: str = "3.12",
    scale: int = 1,
    cases: list[str] | None = None,
    wheels: bool = True,
) -> dict[str, Any]:
    """Compile the cases and gather the wheels the GPU machine lacks into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    prepare(directory / "cases", cases or list(CASES), arch, scale)
    notes: list[str] = []
    names: list[str] = []
    if wheels:
        wdir = directory / "wheels"
        wdir.mkdir(exist_ok=True)
        print("building the polyfuse wheel ...", flush=True)
        r = build_wheel(wdir)
        if r.returncode:
            raise SystemExit(f"pip wheel of polyfuse failed: {r.stderr.strip()[-400:]}")
        version = importlib.metadata.version("islpy")
        print(f"downloading islpy {version} for CPython {python} ...", flush=True)
        plat = [a for p in PLATFORMS for a in ("--platform", p)]
        r = _pip(
            "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python,
            "--implementation", "cp", *plat, "-d", str(wdir), f"islpy=={version}",
        )  # fmt: skip
        if r.returncode:
            notes.append(
                f"no islpy {version} wheel for CPython {python} ({r.stderr.strip()[-200:]}): "
                "the models and tests steps need islpy on the GPU machine"
            )
        names = sorted(p.name for p in wdir.glob("*.whl"))
    size = _dir_bytes(directory)
    if size > MAX_BYTES:
        raise SystemExit(f"{directory}: {size / 2**20:.1f} MiB, over the 60 MiB a GPU call carries")
    day = {
        "format": DAY_FORMAT,
        "arch": arch,
        "python": python,
        "commit": _commit(),
        "wheels": names,
        "bytes": size,
        "notes": notes,
    }
    (directory / DAY).write_text(json.dumps(day, indent=1))
    for n in notes:
        print(f"note: {n}")
    print(f"wrote {directory / DAY}: {len(names)} wheels, {size / 2**20:.1f} MiB")
    return day


def _imports(env: dict[str, str], module: str) -> bool:
    """Whether ``module`` imports in ``env`` as installed (``-P``: the checkout's folders,
    which are not the installed layout, stay off sys.path)."""
    code = f"import {module}"
    return (
        subprocess.run(
            [sys.executable, "-P", "-c", code], env=env, cwd=ROOT, capture_output=True,
            check=False,
        ).returncode
        == 0
    )


def environment(directory: Path) -> tuple[dict[str, str], list[str]]:
    """The steps' environment: the carried wheels on ``PYTHONPATH`` when islpy or polyfuse
    is missing."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # JAX takes 75 % of the GPU's memory at start unless told not to; torch shares the card
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    notes: list[str] = []
    missing = [m for m in ("islpy", "polyfuse.cuda.runtime") if not _imports(env, m)]
    if not missing:
        return env, notes
    wheels = sorted((directory / "wheels").glob("*.whl"))
    if not wheels:
        return env, [f"{' and '.join(missing)} missing and DIR/wheels is empty: steps will fail"]
    site = (directory / "site").resolve()  # absolute: steps run subprocesses in other folders
    r = _pip(
        "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
        "--target", str(site), *map(str, wheels),
    )  # fmt: skip
    if r.returncode:
        notes.append(f"installing the carried wheels failed: {r.stderr.strip()[-300:]}")
        return env, notes
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    notes.append(f"installed {len(wheels)} carried wheels into {site}")
    return env, notes


def _run_step(step: Step, env: dict[str, str], limit: float, logs: Path) -> None:
    """Run one step in its own process group; stop the whole group at ``limit`` seconds."""
    log_path = logs / f"{step.name}.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            step.argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=limit)
            step.status = "ok" if rc == 0 else f"failed (rc {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            step.status = f"timed out after {limit:.0f} s"
    step.seconds = time.perf_counter() - t0
    text = log_path.read_text(errors="replace")
    step.log = "\n".join(text.splitlines()[-40:])
    if step.name == "tests":
        m = re.findall(r"(\d+ (?:passed|failed|skipped|error|errors|xfailed))", text)
        step.summary = ", ".join(m[-4:]) if m else ""


def steps_for(directory: Path, results: Path, fake: bool) -> list[Step]:
    """The day's steps in order of value: timings first, then correctness on hardware, then
    whole models (the longest)."""
    gpu = [sys.executable, str(ROOT / "benchmarks" / "gpu.py")]
    cases = str(directory / "cases")
    run = [*gpu, "--run", cases, "--out", str(results / "run.json")]
    steps = [
        Step("run", run + (["--fake-driver"] if fake else []), 300),
        Step("overhead", [*gpu, "--overhead", cases, "--out", str(results / "overhead.json")], 60),
        Step("tune", [*gpu, "--tune", "--out", str(results / "tune.json")], 150),
        Step("tests", [sys.executable, "-m", "pytest", *PYTEST_ARGS, *GPU_TESTS], 180),
        Step("models", [*gpu, "--models", "--out", str(results / "models.json")], 240),
    ]
    if fake:
        for s in steps[1:]:
            if s.name != "tests":
                s.status = "skipped: needs torch on a GPU (fake driver)"
    return steps


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_all(
    directory: Path,
    out: Path | None = None,
    budget_s: float = 540,
    fake: bool = False,
    steps: tuple[str, ...] = STEPS,
) -> Day:
    """Run the day's ``steps`` (default: all) within ``budget_s`` seconds; write and return
    the report (a step left out is reported as skipped)."""
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        raise SystemExit(f"--steps: unknown step(s) {', '.join(unknown)}; choose from {STEPS}")
    t_end = time.perf_counter() + budget_s
    day_info = _load(directory / DAY) or {}
    results = directory / "results"
    results.mkdir(parents=True, exist_ok=True)
    env, notes = environment(directory)
    for n in notes:
        print(f"note: {n}", flush=True)
    day = Day(str(directory), _commit(), day_info.get("commit", "?"))
    day.steps = steps_for(directory, results, fake)
    for step in day.steps:
        if step.name not in steps:
            step.status = "skipped: not in --steps"
    for step in day.steps:
        if step.status.startswith("skipped"):
            continue
        left = t_end - time.perf_counter() - 5
        if left < 20:
            step.status = "skipped: out of time"
            continue
        print(f"== {step.name} (limit {min(step.limit_s, left):.0f} s)", flush=True)
        _run_step(step, env, min(step.limit_s, left), results)
        print(f"   {step.status} in {step.seconds:.1f} s {step.summary}", flush=True)
    day.run = _load(results / "run.json")
    day.overhead = _load(results / "overhead.json")
    day.models = _load(results / "models.json")
    day.tune = _load(results / "tune.json")
    out = out or results / "gpu_day.json"
    out.write_text(json.dumps(asdict(day) | {"notes": notes}, indent=1, default=str))
    print_day(day)
    print(f"wrote {out}")
    return day


def _f(v: Any, digits: int = 4) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:.{digits}f}"


def print_day(day: Day) -> None:
    """The day as one table of steps, then the figures the steps wrote."""
    print(f"\nGPU day: {day.directory} (prepared at {day.prepared_commit}, run at {day.commit})")
    print("| step | status | seconds | summary |\n|---|---|---|---|")
    for s in day.steps:
        print(f"| {s.name} | {s.status} | {s.seconds:.1f} | {s.summary} |")
    for s in day.steps:
        if s.status.startswith(("failed", "timed out")):
            print(f"--- last lines of {s.name}:\n{s.log}")
    if day.run:
        dev = day.run.get("device", {}).get("name", "?")
        launch = day.run.get("ceilings", {}).get("launch_ms")
        print(
            f"\n{dev}: ms (median); floor = max(bytes / copy rate, FLOPs / cuBLAS FP32 rate); "
            f"one empty launch {_f(launch)}"
        )
        print(
            "| case | polyfuse | eager | inductor | xla | floor | /best | /floor "
            "| /(floor + launch) | rel_err |"
        )
        print("|---" * 10 + "|")
        for r in day.run["results"]:
            p, b, f = r.get("polyfuse_ms"), r.get("best_peer_ms"), r.get("floor_ms")
            print(
                f"| {r['name']} | {_f(p)} | {_f(r.get('eager_ms'))} | {_f(r.get('inductor_ms'))}"
                f" | {_f(r.get('xla_ms'))} | {_f(f)} | {_f(p / b if p and b else None, 2)} | "
                f"{_f(p / f if p and f else None, 2)} | {_f(over_launch(p, f, launch), 2)} | "
                f"{r.get('rel_err', float('inf')):.1e} |"
            )
    if day.overhead:
        print("\n| per-call host time, 4-kernel graph | µs |\n|---|---|")
        for k, v in day.overhead.items():
            print(f"| {k} | {v:.1f} |")
    if day.tune:
        print("\n| case | micrograph | tile (BM, BN, TM, TN, TK) | modelled µs | measured µs |")
        print("|---" * 5 + "|")
        for case, found in day.tune.get("cases", {}).items():
            if isinstance(found, dict):
                print(f"| {case} | error: {found.get('error', '')[:80]} | | | |")
                continue
            for t in found:
                for i, c in enumerate(t["candidates"]):
                    star = " (winner)" if i == t["winner"] else ""
                    print(
                        f"| {case} | {t['micrograph']} | {tuple(c['tile'])}{star} | "
                        f"{_f(c['modelled_us'], 1)} | {_f(c['measured_us'], 1)} |"
                    )
    if day.models:
        print("\n| model | kernels | polyfuse ms | eager | inductor | rel_err | error |")
        print("|---" * 7 + "|")
        for m in day.models.get("models", []):
            print(
                f"| {m['model']} | {m.get('kernels', '-')} | {_f(m.get('polyfuse_ms'), 2)} | "
                f"{_f(m.get('eager_ms'), 2)} | {_f(m.get('inductor_ms'), 2)} | "
                f"{m.get('rel_err', float('inf')):.1e} | {m.get('error', '')[:60]} |"
            )
        if any(m.get("kernels_ms") for m in day.models.get("models", [])):
            import gpu_models  # the costliest kernels, measured beside modelled

            print()
            gpu_models.print_kernel_table(day.models["models"])
