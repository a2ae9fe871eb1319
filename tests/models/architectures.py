"""Architecture families a TinyML user brings, as small seeded plain-torch modules.

Not the zoo's models: each family exercises a pattern the zoo does not (squeeze-excitation
gates, channel shuffle, ceil-mode pooling, transposed convolutions, projection shortcuts,
1-D temporal convolutions, dilation, attention with LayerNorm and GELU, BatchNorm1d,
several inputs and outputs). Tiny on purpose: ``tests/test_architectures.py`` compiles and
verifies each on one RT700 target, ``bench/architectures.py`` on every one. BatchNorm statistics are set from seeded data (as the
zoo does, see ``zoo.models``) so activations keep a healthy range after int8 quantization.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def conv_bn(c_in: int, c_out: int, k: int = 3, s: int = 1, groups: int = 1, act: nn.Module | None = None,
            dilation: int = 1) -> nn.Sequential:  # fmt: skip
    pad = dilation * (k - 1) // 2
    layers: list[nn.Module] = [
        nn.Conv2d(c_in, c_out, k, s, pad, dilation=dilation, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
    ]
    if act is not None:
        layers.append(act)
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, r: int = 4) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(g))))


class MobileNetV3Block(nn.Module):
    def __init__(self, c_in: int, hidden: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.expand = conv_bn(c_in, hidden, 1, act=nn.Hardswish())
        self.dw = conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.Hardswish())
        self.se = SqueezeExcite(hidden)
        self.project = conv_bn(hidden, c_out, 1)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


class MobileNetV3SE(nn.Module):
    """MobileNetV3-small style: hardswish stem, inverted residuals with SE gates."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2, act=nn.Hardswish())
        self.blocks = nn.Sequential(MobileNetV3Block(16, 32, 16, 1), MobileNetV3Block(16, 48, 24, 2))
        self.head = nn.Linear(24, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        half = c // 2
        self.branch = nn.Sequential(
            conv_bn(half, half, 1, act=nn.ReLU()), conv_bn(half, half, 3, groups=half),
            conv_bn(half, half, 1, act=nn.ReLU()),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=1)
        return channel_shuffle(torch.cat([a, self.branch(b)], 1), 2)


class ShuffleNet(nn.Module):
    """ShuffleNetV2 style: chunk, branch, concat, channel shuffle."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2, act=nn.ReLU())
        self.units = nn.Sequential(ShuffleUnit(16), ShuffleUnit(16))
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.units(self.stem(x)), 1).flatten(1))


class Fire(nn.Module):
    def __init__(self, c_in: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(c_in, squeeze, 1)
        self.e1, self.e3 = nn.Conv2d(squeeze, expand, 1), nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.e1(s)), F.relu(self.e3(s))], 1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.1 style: fire modules, ceil-mode max pooling, conv classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, 2)
        self.fire1, self.fire2 = Fire(16, 8, 16), Fire(32, 8, 16)
        self.classifier = nn.Conv2d(32, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.stem(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.fire2(self.fire1(x)), 3, 2, ceil_mode=True)
        return F.adaptive_avg_pool2d(F.relu(self.classifier(x)), 1).flatten(1)


class MBConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hidden = c_in * expand
        self.body = nn.Sequential(
            conv_bn(c_in, hidden, 1, act=nn.ReLU6()), conv_bn(hidden, hidden, 3, stride, hidden, nn.ReLU6()),
            conv_bn(hidden, c_out, 1),
        )  # fmt: skip
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class EfficientNetLite(nn.Module):
    """EfficientNet-lite style: MBConv blocks with ReLU6, no SE."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2, act=nn.ReLU6())
        self.blocks = nn.Sequential(MBConv(16, 16, 1), MBConv(16, 24, 2), MBConv(24, 24, 1))
        self.head = nn.Sequential(conv_bn(24, 64, 1, act=nn.ReLU6()))
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.head(self.blocks(self.stem(x))), 1).flatten(1))


class UNet(nn.Module):
    """Two-level U-Net: max-pool down, transposed-conv up, skip concatenation, per-pixel logits."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.enc1 = conv_bn(3, 8, act=nn.ReLU())
        self.enc2 = conv_bn(8, 16, act=nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = conv_bn(16, 8, act=nn.ReLU())
        self.out = nn.Conv2d(8, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        return self.out(self.dec(torch.cat([F.relu(self.up(e2)), e1], 1)))


class ProjectionBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(c_in, c_out, 3, stride, act=nn.ReLU()), conv_bn(c_out, c_out, 3))
        self.shortcut = conv_bn(c_in, c_out, 1, stride)  # projection, also where shapes agree

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class ResNetProjection(nn.Module):
    """ResNet with 1x1 projection shortcuts (stride 2 and channel changes)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = conv_bn(3, 8, act=nn.ReLU())
        self.stages = nn.Sequential(ProjectionBlock(8, 16, 2), ProjectionBlock(16, 32, 2))
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1).flatten(1))


class KeywordSpotting(nn.Module):
    """Depthwise-separable KWS on a 49x10 MFCC map (DS-CNN style, narrower, with avg pooling)."""

    def __init__(self, classes: int = 12) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, 16, (10, 4), (2, 2), (5, 1), bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.ds = nn.Sequential(
            conv_bn(16, 16, 3, groups=16, act=nn.ReLU()), conv_bn(16, 24, 1, act=nn.ReLU()),
            conv_bn(24, 24, 3, groups=24, act=nn.ReLU()), conv_bn(24, 24, 1, act=nn.ReLU()),
        )  # fmt: skip
        self.fc = nn.Linear(24, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.avg_pool2d(self.ds(self.stem(x)), (25, 5)).flatten(1))


class TemporalAudio(nn.Module):
    """1-D temporal convolutions over audio features (channels x time), global pooling."""

    def __init__(self, features: int = 8, classes: int = 6) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = features
        for c_out, stride in ((16, 1), (16, 2), (24, 2)):
            layers += [nn.Conv1d(c, c_out, 5, stride, 2, bias=False), nn.BatchNorm1d(c_out), nn.ReLU()]
            c = c_out
        self.net = nn.Sequential(*layers)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.net(x).mean(-1))


class DilatedConv(nn.Module):
    """Dilated 3x3 convolutions (growing receptive field without pooling), context-module style."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            conv_bn(3, 16, 3, act=nn.ReLU()), conv_bn(16, 16, 3, act=nn.ReLU(), dilation=2),
            conv_bn(16, 16, 3, act=nn.ReLU(), dilation=4), conv_bn(16, 16, 3, 2, act=nn.ReLU()),
        )  # fmt: skip
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.net(x), 1).flatten(1))


class TinyTransformer(nn.Module):
    """One pre-norm transformer encoder block: LayerNorm, 2-head attention, GELU MLP, mean pool."""

    def __init__(self, dim: int = 16, heads: int = 2, classes: int = 5) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.fc = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)

        def heads(z: torch.Tensor) -> torch.Tensor:
            return z.reshape(b, t, self.heads, self.head_dim).transpose(1, 2)

        att = torch.softmax(heads(q) @ heads(k).transpose(-1, -2) / self.head_dim**0.5, dim=-1)
        x = x + self.proj((att @ heads(v)).transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.ln2(x))
        return self.fc(x.mean(1))


class MlpBatchNorm(nn.Module):
    """Fully connected net with BatchNorm1d (tabular / sensor features)."""

    def __init__(self, features: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, 64), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MultiInputOutput(nn.Module):
    """An image and a sensor vector in; class logits and a regression head out."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.image = nn.Sequential(conv_bn(3, 8, 3, 2, act=nn.ReLU()), conv_bn(8, 16, 3, 2, act=nn.ReLU()))
        self.sensor = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.classify = nn.Linear(32, classes)
        self.regress = nn.Linear(32, 2)

    def forward(self, image: torch.Tensor, sensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.cat([F.adaptive_avg_pool2d(self.image(image), 1).flatten(1), self.sensor(sensor)], 1)
        return self.classify(z), self.regress(z)


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], nn.Module]
    input_shapes: tuple[tuple[int, ...], ...]
    description: str


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "mobilenet_v3_se",
            MobileNetV3SE,
            ((1, 3, 32, 32),),
            "MobileNetV3 blocks with SE (hardsigmoid) gates",
        ),
        Family(
            "shufflenet", ShuffleNet, ((1, 3, 32, 32),), "ShuffleNetV2 units: chunk, concat, channel shuffle"
        ),
        Family("squeezenet", SqueezeNet, ((1, 3, 32, 32),), "SqueezeNet fire modules, ceil-mode max pooling"),
        Family("efficientnet_lite", EfficientNetLite, ((1, 3, 32, 32),), "EfficientNet-lite MBConv, ReLU6"),
        Family("unet", UNet, ((1, 3, 16, 16),), "U-Net: transposed conv, skip concatenation"),
        Family("resnet_projection", ResNetProjection, ((1, 3, 32, 32),), "ResNet, 1x1 projection shortcuts"),
        Family("kws_ds", KeywordSpotting, ((1, 1, 49, 10),), "depthwise-separable keyword spotting"),
        Family("audio_conv1d", TemporalAudio, ((1, 8, 64),), "1-D temporal convolutions over audio features"),
        Family("dilated", DilatedConv, ((1, 3, 32, 32),), "dilated 3x3 convolutions"),
        Family(
            "transformer", TinyTransformer, ((1, 8, 16),), "transformer block: LayerNorm, attention, GELU"
        ),
        Family("mlp_bn1d", MlpBatchNorm, ((1, 32),), "MLP with BatchNorm1d"),
        Family("multi_io", MultiInputOutput, ((1, 3, 32, 32), (1, 6)), "two inputs, two outputs"),
    )
}


def _set_batchnorm_stats(model: nn.Module, shapes: tuple[tuple[int, ...], ...], seed: int) -> None:
    """Running statistics from seeded data (default stats would shrink activations to ~0)."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(*(torch.randn((16, *s[1:]), generator=g) for s in shapes))
    model.eval()


def build(name: str, seed: int = 0, calibration: int = 8) -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:  # fmt: skip
    """(model in eval mode, example inputs, calibration batches), all seeded."""
    family = FAMILIES[name]
    torch.manual_seed(seed)
    model = family.build()
    _set_batchnorm_stats(model, family.input_shapes, seed)
    g = torch.Generator().manual_seed(seed + 2)

    def batch() -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(s, generator=g) for s in family.input_shapes)

    return model.eval(), batch(), [batch() for _ in range(calibration)]
