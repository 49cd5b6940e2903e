"""The cost model's constants: one declared place, each with its source.

Device figures (SM count, clock, DRAM and FP32 rates, L1 size, L2 bandwidth) live in the
device table (:mod:`polyfuse.poly.device`), measured where a GPU was measured; the H100's
``l2_gbps`` was fitted below. The constants here are the model's own. The fitted
ones come from the 17 cases timed on an H100 on 2026-11-22
(``../shared/bench/gpu/h100-2026-11-22.json``: kernels of commit fc634f1, stored as
descriptions in ``benchmarks/measured/calibration_kernels.json``), by least squares in
log(measured / modelled) (``python benchmarks/calibration.py --fit``); the 2026-11-25 day
(commit fcb3b1c) is held out for validation (``python benchmarks/calibration.py``).

- ``launch_us`` = 2.4: *measured* 2026-11-25, the GPU time per call of the 4-kernel
  attention graph replayed as a CUDA graph (9.54 us / 4 launches).
- ``call_us`` = 2.25: *fitted*: what one timed call adds once beyond its launches (events,
  the first launch's latency).
- ``scalar_efficiency`` = 0.86: *fitted*: the DRAM rate of 32-bit accesses over the copy rate
  (every 2026-11-22 kernel used them; 128-bit accesses run at the copy rate).
- ``latency_us`` = 1.4: *fitted*: DRAM latency under load, for Little's law (binds where few
  threads keep little in flight: batchnorm_train_relu's one 1024-thread block per SM, the
  one-load transposes, rmsnorm_swiglu's 45M one-element threads).
- ``overlap_p`` = 4: *fitted*: the resources of a launch overlap imperfectly; its busy time is
  the 4-norm of the resource times (the largest, plus a little when others come close). The
  held-out day agrees: the tiled GEMMs of 2026-11-25 are modelled within 3 % with 4, 11-19 %
  fast with a plain maximum.
- ``issue_warps`` = 2: *assumed*: warps per scheduler that keep it issuing every clock
  (unrolled loops with independent FP32 chains); no measured kernel had fewer.
- the H100's ``l2_gbps`` = 8750 (in :mod:`polyfuse.poly.device`): *fitted*, binds the two
  one-output-per-thread GEMMs (matmul_4096, ffn_up_gelu), whose blocks stream their weight
  columns from L2.

All five are fitted together (coordinate descent over a grid) on the 17 cases.

What the model does with them is :mod:`polyfuse.poly.costs.model`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The day and data the fitted constants come from.
CALIBRATION_DAY = "2026-11-22"
CALIBRATION_SOURCE = (
    "../shared/bench/gpu/h100-2026-11-22.json (H100 80GB HBM3, kernels of commit fc634f1)"
)


@dataclass(frozen=True)
class CostConstants:
    """The cost model's own constants (see the module doc for each one's source)."""

    launch_us: float = 2.4
    call_us: float = 2.25
    scalar_efficiency: float = 0.86
    latency_us: float = 1.4
    issue_warps: float = 2.0
    overlap_p: float = 4.0

    def table(self) -> list[tuple[str, float, str]]:
        """(name, value, source) of every constant, for printed reports."""
        return [
            ("launch_us", self.launch_us, "measured 2026-11-25 (CUDA-graph call of 4 kernels / 4)"),
            ("call_us", self.call_us, f"fitted {CALIBRATION_DAY}"),
            ("scalar_efficiency", self.scalar_efficiency, f"fitted {CALIBRATION_DAY}"),
            ("latency_us", self.latency_us, f"fitted {CALIBRATION_DAY}"),
            ("issue_warps", self.issue_warps, "assumed (unrolled independent FP32 chains)"),
            ("overlap_p", self.overlap_p, f"fitted {CALIBRATION_DAY}"),
        ]


CONSTANTS = CostConstants()
