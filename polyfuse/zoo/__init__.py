"""``polyfuse.zoo``: built-in models built from :mod:`polyfuse.ops`, by shape only.

Models (``MODELS``): ``bert_base`` (encoder from the embedding output, 12 layers, batch 8,
seq 128, hidden 768, 12 heads, FFN 3072, GELU), ``gpt2_small`` (12 pre-LN blocks, causal mask
as an additive input), ``vit_b16`` (224x224, patch embedding as a 16x16/16 conv, 12 layers),
``resnet50``, ``mobilenet_v2`` (depthwise convs as ``groups``, ReLU6 =
``minimum(relu(x), 6)``), ``lstm`` (unrolled, T=16), ``wide_deep`` and ``deepfm`` (embeddings as
inputs; DeepFM's FM second-order term with reductions). Each has a ``"full"`` size and a
``"tiny"`` size that runs on the CPU emulator in seconds.

Weights are placeholders bound through ``constants`` (``polyfuse.compile(..., constants=)``),
never real: seeded random arrays by default, or lazily allocated zeros with
``weights="zeros"`` (what ``polyfuse zoo`` uses: compiling needs only shapes). Activations
(embedding outputs, images, masks) are ``inputs``.

Example::

    from polyfuse import zoo
    inputs, outputs, constants, reference = zoo.build("bert_base", size="tiny")
    fn = polyfuse.compile(inputs, outputs, constants=constants)
    arrays = zoo.build("bert_base", "tiny").sample_inputs()   # or any arrays of the shapes
    got = fn(*arrays, device="emulate"); want = reference(*arrays)

``reference(*arrays)`` evaluates the same model definition in float64 numpy with an
independent implementation of every op (:class:`polyfuse.zoo.backend.NumpyBackend`) and the
same weight arrays; it is ``None`` with ``weights="zeros"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyfuse.errors import PolyfuseError
from polyfuse.graph.dtypes import numpy_dtype
from polyfuse.graph.expr import Tensor
from polyfuse.zoo import cnn, recsys, rnn, transformers
from polyfuse.zoo.backend import FLOAT_DTYPES, NumpyBackend, TeBackend

__all__ = ["MODELS", "SIZES", "ModelSpec", "ZooModel", "build"]

SIZES = ("full", "tiny")


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry: a backend-generic definition and its configurations per size."""

    name: str
    description: str
    define: Callable[[Any, dict], list[Any]]
    configs: dict[str, dict]


@dataclass
class ZooModel:
    """A built model; unpacks as ``inputs, outputs, constants, reference``."""

    name: str
    size: str
    inputs: list[Tensor]
    outputs: list[Tensor]
    constants: dict[Tensor, np.ndarray]
    reference: Callable[..., tuple[np.ndarray, ...]] | None
    input_kinds: dict[str, str] = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.inputs, self.outputs, self.constants, self.reference))

    def sample_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """One array per input in its dtype: normal values, causal masks as 0 / -1e9."""
        rng = np.random.default_rng(seed)
        out = []
        for t in self.inputs:
            kind = self.input_kinds.get(t.name, "normal")
            if kind == "causal_mask":
                n = t.shape[-1]
                a = np.triu(np.full((n, n), -1e9, np.float32), k=1)
                a = np.broadcast_to(a, t.shape).copy()
            elif kind == "positive":
                a = np.abs(rng.standard_normal(t.shape)).astype(np.float32) + 0.5
            else:
                a = rng.standard_normal(t.shape).astype(np.float32)
            out.append(a.astype(numpy_dtype(t.dtype)))
        return out


def _spec(name: str, description: str, define: Callable, configs: dict) -> ModelSpec:
    return ModelSpec(name, description, define, configs)


#: The built-in zoo, by name.
MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        _spec(
            "bert_base",
            "BERT-base encoder, 12 layers, batch 8, seq 128, hidden 768",
            transformers.bert_model,
            transformers.BERT,
        ),
        _spec(
            "gpt2_small",
            "GPT-2 small block stack, 12 layers, causal mask input",
            transformers.gpt2_model,
            transformers.GPT2,
        ),
        _spec("vit_b16", "ViT-B/16, 224x224, 12 layers", transformers.vit_model, transformers.VIT),
        _spec("resnet50", "ResNet-50 v1.5, batch 8, 224x224", cnn.resnet50_model, cnn.RESNET50),
        _spec(
            "mobilenet_v2",
            "MobileNetV2, batch 8, 224x224",
            cnn.mobilenet_v2_model,
            cnn.MOBILENET_V2,
        ),
        _spec("lstm", "LSTM unrolled over T=16 steps", rnn.lstm_model, rnn.LSTM),
        _spec("wide_deep", "Wide&Deep, batch 512", recsys.wide_deep_model, recsys.WIDE_DEEP),
        _spec("deepfm", "DeepFM, batch 512", recsys.deepfm_model, recsys.DEEPFM),
    )
}


def build(
    name: str, size: str = "full", *, seed: int = 0, weights: str = "random",
    dtype: str = "float32",
) -> ZooModel:  # fmt: skip
    """Build zoo model ``name`` at ``size`` ("full" or "tiny").

    Returns a :class:`ZooModel` that unpacks as ``(inputs, outputs, constants, reference)``.
    ``weights="zeros"`` allocates the weight arrays lazily (no memory touched) and gives no
    reference. ``dtype``: the inputs' and weights' dtype, ``"float32"`` or a 16-bit one
    (``"bfloat16"``, ``"float16"``: the model's GEMMs and convolutions on tensor cores; the
    reference stays float64 on the same weights).
    """
    if name not in MODELS:
        raise PolyfuseError(f"zoo: unknown model '{name}'; known: {', '.join(MODELS)}")
    if size not in SIZES:
        raise PolyfuseError(f"zoo: unknown size '{size}'; use 'full' or 'tiny'")
    spec = MODELS[name]
    cfg = dict(spec.configs[size])
    if dtype not in FLOAT_DTYPES:
        raise PolyfuseError(f"zoo: unknown dtype '{dtype}'; use {', '.join(FLOAT_DTYPES)}")
    tb = TeBackend(seed=seed, weights=weights, dtype=dtype)
    outputs = spec.define(tb, cfg)
    reference = None
    if weights == "random":
        params = dict(tb.params)
        names = [t.name for t in tb.inputs]

        def reference(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
            """The model in float64 numpy on ``arrays`` (one per input, in order)."""
            if len(arrays) != len(names):
                raise ValueError(f"{name}: expected {len(names)} arrays, got {len(arrays)}")
            nb = NumpyBackend(dict(zip(names, arrays, strict=True)), params)
            return tuple(np.asarray(o) for o in spec.define(nb, cfg))

    return ZooModel(
        name, size, tb.inputs, outputs, tb.constants, reference, dict(tb.input_kinds), cfg
    )
