"""``benchmarks/zoo_modelled.py``: the zoo's kernels as the cost model prices them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import zoo_modelled  # noqa: E402


def test_table_and_json_price_every_kernel_and_packs_as_layer3_did(tmp_path, capsys):
    out = tmp_path / "zoo.json"
    assert zoo_modelled.main(["deepfm", "wide_deep", "--size", "tiny", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| deepfm |" in text and "| wide_deep |" in text and "MODELLED" in text
    report = json.loads(out.read_text())
    assert report["arch"] == "sm_90" and [m["model"] for m in report["models"]] == [
        "deepfm",
        "wide_deep",
    ]
    for m in report["models"]:
        ks = m["costliest"]
        assert len(ks) == m["kernels"] > 0
        assert abs(sum(k["modelled_us"] for k in ks) - m["modelled_us"]) < 1e-6
        assert all(k["modelled_us"] > 0 and k["floor_us"] >= 0 for k in ks)
        assert [k["modelled_us"] for k in ks] == sorted((k["modelled_us"] for k in ks),
                                                        reverse=True)  # fmt: skip
    packs = [k for m in report["models"] for k in m["costliest"] if k["bound"] == "Layer 3 pack"]
    assert packs and all(k["kernel"].startswith("pk") for k in packs)


def test_bfloat16_floor_counts_mma_at_the_tensor_core_rate(tmp_path):
    """A tensorized kernel's floor is its mma instructions at the tensor cores' rate (it was
    its bytes alone: its FLOPs were counted from FFMA, of which it has none)."""
    out = tmp_path / "zoo.json"
    assert zoo_modelled.main(["bert_base", "--size", "tiny", "--dtype", "bfloat16",
                              "--json", str(out)]) == 0  # fmt: skip
    report = json.loads(out.read_text())
    assert report["dtype"] == "bfloat16"
    (m,) = report["models"]
    gemms = [k for k in m["costliest"] if "matmul" in k["kernel"] and k["bound"] != "Layer 3 pack"]
    assert gemms
    for k in gemms:
        mma_floor = k["mma_floor_us"]
        assert mma_floor > 0, k
        assert k["floor_us"] >= mma_floor
        assert k["modelled_us"] >= k["floor_us"]
