"""Benchmark: post-training quantization vs quantization-aware training on real data.

Run: .venv/bin/python bench/qat.py [--target imxrt700cm] [--models digits_cnn mlp8 ...]

Per model: top-1 accuracy on a held-out split (``etforge verify OUT --data``, the compiled
``.pte`` run by the host interpreter in the device's arithmetic) of the float model, of the
PTQ compile (``etforge.compile``, calibrated on 16 training samples), of the QAT compile
(``etforge.qat``: the trained float model fine-tuned with fake quantization on the training
split, seeded: ``QAT_SCHEDULE``) and of the control, "tuned PTQ": the same fine-tuning
without fake quantization, then PTQ. QAT ahead of PTQ by no more than the control is ahead
is the extra training's gain, not quantization-awareness's.

Models: the trained zoo's ``digits_cnn`` and ``digits_mlp``; small MLPs trained here
(``mlpN``: 64 -> N -> 10, 30 epochs, seeded); ``attn64``: self-attention over the 64
pixels as tokens (a vision transformer with 1x1 patches; its softmax spreads over 64 keys,
and int8 holds a probability in steps of 1/256); ``wine_raw``: scikit-learn's bundled wine
data (178 samples, 13 features from 0.1 to 1,680), an MLP that standardizes its raw inputs
itself (firmware feeds sensor values as they are) - the one int8 input scale is set by the
widest feature, so PTQ loses the narrow ones at the input, where no training helps.
Single-threaded; no timings.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

import etforge
import etforge.qat as qat
from etforge.runtime.verification.verify import verify
from etforge.zoo import digits

#: QAT fine-tuning per model: (epochs, Adam learning rate). The digits models are fine-tuned
#: gently; wine_raw must relearn to classify from what int8 keeps of its inputs.
QAT_SCHEDULE = {"wine_raw": (30, 1e-2)}
DEFAULT_SCHEDULE = (3, 1e-3)


def _fit(module: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, seed: int) -> None:
    order = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=order)
        for i in range(0, len(perm), 64):
            idx = perm[i : i + 64]
            opt.zero_grad()
            nn.functional.cross_entropy(module(x[idx]), y[idx]).backward()
            opt.step()


class RawInputs(nn.Module):
    """An MLP that standardizes raw features itself (training-split mean and deviation)."""

    def __init__(self, x: torch.Tensor, classes: int, hidden: int = 16) -> None:
        super().__init__()
        self.register_buffer("mean", x.mean(0, keepdim=True))
        self.register_buffer("std", x.std(0, keepdim=True))
        self.hidden, self.out = nn.Linear(x.shape[1], hidden), nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden((x - self.mean) / self.std)))


class PixelAttention(nn.Module):
    """One self-attention block over the 64 pixels as tokens, then an MLP, mean-pooled: the
    shape of a vision transformer with 1x1 patches. Its softmax spreads over 64 keys (about
    1/64 each), and int8 holds a probability in steps of 1/256: the post-softmax rounding
    that post-training quantization of vision transformers is known to lose on."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(1, dim)
        self.pos = nn.Parameter(torch.zeros(1, 64, dim))
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, digits.NUM_CLASSES)
        self.scale = dim**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(-1, 64, 1)) + self.pos
        q, k, v = self.qkv(h).chunk(3, -1)
        h = h + self.proj(torch.softmax(q @ k.transpose(1, 2) * self.scale, -1) @ v)
        h = h + self.mlp(h)
        return self.head(h.mean(1))


Split = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _wine() -> Split:
    from sklearn.datasets import load_wine

    wine = load_wine()
    x, y = torch.tensor(wine.data, dtype=torch.float32), torch.tensor(wine.target, dtype=torch.int64)
    test = torch.arange(len(y)) % digits.TEST_EVERY == 0
    return x[~test], y[~test], x[test], y[test]


def _model(name: str, tmp: Path) -> tuple[nn.Module, str, Split]:
    """(trained float model, its --data, the data split)."""
    if name in digits.CONFIGS:
        x, y, xt, yt = digits.split()
        return digits.trained(name)(), f"zoo:{name}", (digits.shaped(name, x), y, xt, yt)
    torch.manual_seed(0)
    if name == "wine_raw":
        split = _wine()
        model: nn.Module = RawInputs(split[0], 3)
        _fit(model, split[0], split[1], 100, 1e-2, 0)
        data = tmp / "wine_test.pt"
        torch.save({"x": split[2], "y": split[3]}, data)
        return model.eval(), str(data), split
    split = digits.split()
    if name == "attn64":
        model = PixelAttention()
        _fit(model, split[0], split[1], 100, 1e-2, 0)
        return model.eval(), "zoo:digits_mlp", split
    hidden = int(name.removeprefix("mlp"))
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    _fit(model, split[0], split[1], 30, 1e-2, 0)
    return model.eval(), "zoo:digits_mlp", split


def _accuracy(compiled: Any, data: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        v = verify(compiled.save(Path(tmp) / "out"), samples=4, data=data, max_accuracy_drop=100.0)
    return float(v.float_accuracy), float(v.compiled_accuracy)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="imxrt700cm")
    ap.add_argument(
        "--models", nargs="+", default=["digits_cnn", "digits_mlp", "mlp8", "mlp16", "attn64", "wine_raw"]
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        f"target {args.target}; top-1 accuracy in % on the held-out split (every 5th sample), via verify --data"
    )
    print(
        f"{'model':<12} {'float':>7} {'PTQ':>7} {'QAT':>7} {'PTQ loss':>9} {'QAT-PTQ':>8} "
        f"{'tuned PTQ':>10} {'QAT-tuned':>10}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="etforge-bench-qat-"))
    for name in args.models:
        model, data, (x, y, _, _) = _model(name, tmp)
        step = max(1, len(x) // 16)  # 16 training samples spread over the split
        calib = [(s.unsqueeze(0),) for s in x[::step][:16]]
        ptq = etforge.compile(model, calib[0], target=args.target, calibration=calib)
        float_acc, ptq_acc = _accuracy(ptq, data)
        epochs, lr = QAT_SCHEDULE.get(name, DEFAULT_SCHEDULE)
        # The control: the same fine-tuning without fake quantization, then PTQ. QAT beating
        # PTQ by no more than this is the extra training's, not quantization-awareness's.
        tuned = copy.deepcopy(model).train()
        torch.manual_seed(1)
        _fit(tuned, x, y, epochs, lr, 1)
        tuned_ptq = etforge.compile(tuned.eval(), calib[0], target=args.target, calibration=calib)
        _, tuned_acc = _accuracy(tuned_ptq, data)
        prepared = qat.prepare(model, calib[0], target=args.target)
        torch.manual_seed(1)
        _fit(prepared, x, y, epochs, lr, 1)
        prepared.eval()
        _, qat_acc = _accuracy(qat.compile(prepared, calib[0]), data)
        print(
            f"{name:<12} {float_acc:7.2f} {ptq_acc:7.2f} {qat_acc:7.2f} {float_acc - ptq_acc:9.2f} "
            f"{qat_acc - ptq_acc:8.2f} {tuned_acc:10.2f} {qat_acc - tuned_acc:10.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
