"""Convolutional models: ResNet-50 (v1.5) and MobileNetV2, NCHW, inference batch norm."""

from __future__ import annotations

from typing import Any

__all__ = ["MOBILENET_V2", "RESNET50", "mobilenet_v2_model", "resnet50_model"]

#: ``blocks``: bottleneck blocks per stage; ``widths``: bottleneck widths (output = 4x).
RESNET50 = {
    "full": dict(batch=8, image=224, stem=64, blocks=(3, 4, 6, 3), widths=(64, 128, 256, 512),
                 classes=1000, tiny=False),
    "tiny": dict(batch=1, image=16, stem=8, blocks=(1, 1), widths=(4, 8), classes=10, tiny=True),
}  # fmt: skip

#: ``settings``: (expansion t, channels c, repeats n, stride s) per stage, as in the paper.
MOBILENET_V2 = {
    "full": dict(
        batch=8,
        image=224,
        stem=32,
        settings=(
            (1, 16, 1, 1),
            (6, 24, 2, 2),
            (6, 32, 3, 2),
            (6, 64, 4, 2),
            (6, 96, 3, 1),
            (6, 160, 3, 2),
            (6, 320, 1, 1),
        ),
        last=1280,
        classes=1000,
    ),
    "tiny": dict(
        batch=1,
        image=16,
        stem=8,
        settings=((1, 8, 1, 1), (2, 12, 2, 2)),
        last=16,
        classes=10,
    ),
}


def conv_bn(
    b: Any,
    x: Any,
    c_out: int,
    k: int,
    name: str,
    stride: int = 1,
    groups: int = 1,
    act: str | None = "relu",
) -> Any:
    """Conv (no bias) → inference batch norm → ReLU / ReLU6 / nothing."""
    c_in = b.shape(x)[1]
    w = b.param(f"{name}_w", (c_out, c_in // groups, k, k))
    y = b.conv2d(x, w, None, stride=stride, padding=k // 2, groups=groups)
    y = b.batch_norm(
        y,
        b.param(f"{name}_bn_mean", (c_out,), "zero"),
        b.param(f"{name}_bn_var", (c_out,), "var"),
        b.param(f"{name}_bn_gamma", (c_out,), "one"),
        b.param(f"{name}_bn_beta", (c_out,), "zero"),
        1e-5,
    )
    if act == "relu":
        return b.relu(y)
    if act == "relu6":
        return b.minimum(b.relu(y), 6.0)
    return y


def head(b: Any, x: Any, classes: int) -> Any:
    """Global average pool over H, W and the classifier."""
    c = b.shape(x)[1]
    pooled = b.reduce_mean(x, (2, 3))
    w = b.param("fc_w", (c, classes))
    return b.add(b.matmul(pooled, w), b.param("fc_bias", (classes,), "zero"))


def bottleneck(b: Any, x: Any, width: int, stride: int, name: str) -> Any:
    """ResNet v1.5 bottleneck: 1x1, 3x3 (strided), 1x1 (x4), projection when shapes change."""
    c_in = b.shape(x)[1]
    y = conv_bn(b, x, width, 1, f"{name}_a")
    y = conv_bn(b, y, width, 3, f"{name}_b", stride=stride)
    y = conv_bn(b, y, 4 * width, 1, f"{name}_c", act=None)
    if stride != 1 or c_in != 4 * width:
        x = conv_bn(b, x, 4 * width, 1, f"{name}_proj", stride=stride, act=None)
    return b.relu(b.add(y, x))


def resnet50_model(b: Any, cfg: dict) -> list[Any]:
    """ResNet-50: 7x7/2 stem, 3x3/2 max pool, four bottleneck stages, pool, fc.

    The tiny size uses a 3x3/1 stem and two one-block stages.
    """
    x = b.input("image", (cfg["batch"], 3, cfg["image"], cfg["image"]))
    if cfg["tiny"]:
        x = conv_bn(b, x, cfg["stem"], 3, "stem")
    else:
        x = conv_bn(b, x, cfg["stem"], 7, "stem", stride=2)
    x = b.max_pool2d(x, 3, 2, 1)
    for s, (n, width) in enumerate(zip(cfg["blocks"], cfg["widths"], strict=True)):
        for i in range(n):
            stride = 2 if (i == 0 and s > 0) else 1
            x = bottleneck(b, x, width, stride, f"stage{s + 1}_block{i}")
    return [head(b, x, cfg["classes"])]


def inverted_residual(b: Any, x: Any, t: int, c_out: int, stride: int, name: str) -> Any:
    """MobileNetV2 block: 1x1 expand (ReLU6), 3x3 depthwise (groups = channels, ReLU6), 1x1
    linear projection; residual when the shape is kept."""
    c_in = b.shape(x)[1]
    hidden = c_in * t
    y = x if t == 1 else conv_bn(b, x, hidden, 1, f"{name}_expand", act="relu6")
    y = conv_bn(b, y, hidden, 3, f"{name}_dw", stride=stride, groups=hidden, act="relu6")
    y = conv_bn(b, y, c_out, 1, f"{name}_project", act=None)
    return b.add(x, y) if stride == 1 and c_in == c_out else y


def mobilenet_v2_model(b: Any, cfg: dict) -> list[Any]:
    """MobileNetV2 (width 1.0): 3x3/2 stem, inverted residual stages, 1x1 conv, pool, fc."""
    x = b.input("image", (cfg["batch"], 3, cfg["image"], cfg["image"]))
    x = conv_bn(b, x, cfg["stem"], 3, "stem", stride=2, act="relu6")
    for s, (t, c, n, stride) in enumerate(cfg["settings"]):
        for i in range(n):
            x = inverted_residual(b, x, t, c, stride if i == 0 else 1, f"stage{s + 1}_block{i}")
    x = conv_bn(b, x, cfg["last"], 1, "last", act="relu6")
    return [head(b, x, cfg["classes"])]
