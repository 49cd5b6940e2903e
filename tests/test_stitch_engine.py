"""Layer 2 stitching on the merge engine makes the same kernel groups and decisions as the
original rescanning loop (:mod:`stitch_reference`, test-only)."""

from __future__ import annotations

import random

import pytest
from stitch_reference import reference_stitch_memory
from test_partition_engine import te_random_program

import polyfuse
from polyfuse.poly.device import device_for_arch
from polyfuse.stitch.memory import stitch_memory
from polyfuse.zoo import MODELS, build


def assert_same_stitching(name: str, size: str) -> None:
    m = build(name, size, weights="zeros")
    assert_same_plan(polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False))


def assert_same_plan(fn) -> None:
    plan, device = fn.plan, device_for_arch("sm_80")
    new_groups, new_dec = stitch_memory(plan.graph, plan.partition, plan.scheduled, device)
    old_groups, old_dec = reference_stitch_memory(
        plan.graph, plan.partition, plan.scheduled, device
    )
    assert [(g.names, g.kind) for g in new_groups] == [(g.names, g.kind) for g in old_groups]
    assert [str(d) for d in new_dec] == [str(d) for d in old_dec]
    assert [d.tensors for d in new_dec] == [d.tensors for d in old_dec]


@pytest.mark.parametrize(
    "name",  # the two largest tiny transformers (~10 s each) in the slow tier
    [
        pytest.param(n, marks=pytest.mark.slow) if n in ("gpt2_small", "vit_b16") else n
        for n in MODELS
    ],
)
def test_zoo_tiny_stitching_matches_reference(name):
    assert_same_stitching(name, "tiny")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_base", "gpt2_small", "resnet50"])
def test_zoo_full_stitching_matches_reference(name):
    assert_same_stitching(name, "full")


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_stitch_like_reference(seed):
    rng = random.Random(2000 + seed)
    inputs, outputs = te_random_program(rng, rng.randint(4, 14))
    assert_same_plan(polyfuse.compile(inputs, outputs, check_cuda=False))
