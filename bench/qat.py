"""Benchmark: post-training quantization vs quantization-aware training on real data.

Run: .venv/bin/python bench/qat.py [--target imxrt700cm] [--models digits_cnn mlp8 ...] [--epochs 3]

Per model: top-1 accuracy on scikit-learn's 8×8 digits held-out split (``etforge verify OUT
--data``, the compiled ``.pte`` run by the host interpreter) of the float model, of the PTQ
compile (``etforge.compile``, calibrated on 16 training samples) and of the QAT compile
(``etforge.qat``: the trained float model fine-tuned with fake quantization for ``--epochs``
epochs of Adam at 1e-3 on the training split, seeded), and the points each loses against
float. Models: the trained zoo's ``digits_cnn`` and ``digits_mlp``, and small MLPs trained
here (``mlpN``: 64 -> N -> 10, 30 epochs, seeded). Single-threaded; no timings.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

import etforge
import etforge.qat as qat
from etforge.runtime.verify import verify
from etforge.zoo import digits


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


def _model(name: str) -> tuple[nn.Module, str]:
    """(trained float model, the zoo data set its inputs are shaped like)."""
    if name in digits.CONFIGS:
        return digits.trained(name)(), name
    hidden = int(name.removeprefix("mlp"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    x, y, _, _ = digits.split()
    _fit(model, x, y, 30, 1e-2, 0)
    return model.eval(), "digits_mlp"


def _accuracy(compiled: Any, data: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        v = verify(compiled.save(Path(tmp) / "out"), samples=4, data=f"zoo:{data}", max_accuracy_drop=100.0)
    return float(v.float_accuracy), float(v.compiled_accuracy)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="imxrt700cm")
    ap.add_argument("--models", nargs="+", default=["digits_cnn", "digits_mlp", "mlp8", "mlp16"])
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"target {args.target}; accuracy in % on the digits test split (360 samples), via verify --data")
    print(f"{'model':<12} {'float':>7} {'PTQ':>7} {'QAT':>7} {'PTQ loss':>9} {'QAT loss':>9} {'QAT-PTQ':>8}")
    for name in args.models:
        model, data = _model(name)
        calib = digits.calibration(data, 16)
        ptq = etforge.compile(model, calib[0], target=args.target, calibration=calib)
        float_acc, ptq_acc = _accuracy(ptq, data)
        x, y, _, _ = digits.split()
        prepared = qat.prepare(model, calib[0], target=args.target)
        torch.manual_seed(1)
        _fit(prepared, digits.shaped(data, x), y, args.epochs, 1e-3, 1)
        prepared.eval()
        qat_float, qat_acc = _accuracy(qat.compile(prepared, calib[0]), data)
        print(
            f"{name:<12} {float_acc:7.2f} {ptq_acc:7.2f} {qat_acc:7.2f} {float_acc - ptq_acc:9.2f} "
            f"{float_acc - qat_acc:9.2f} {qat_acc - ptq_acc:8.2f}   (QAT's own float {qat_float:.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
