"""A model given in training mode is compiled in eval mode, says so, and is given back as it came."""

from __future__ import annotations

import copy

import torch
from torch import nn

import etforge
from etforge.core.build.summary import summary_notes


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5))
    with torch.no_grad():  # running statistics that differ from any batch's own
        model[1].running_mean.uniform_(-1.0, 1.0)
        model[1].running_var.uniform_(0.5, 2.0)
    return model


def _inputs() -> tuple[tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(1, 3, 8, 8, generator=g),), [
        (torch.randn(1, 3, 8, 8, generator=g),) for _ in range(4)
    ]


def test_training_model_compiles_as_eval_told_and_left_as_given() -> None:
    example, calibration = _inputs()
    training = _model()
    assert training.training
    evaluated = copy.deepcopy(training).eval()
    told = etforge.compile(training, example, target="cortex-m33", calibration=calibration)
    quiet = etforge.compile(evaluated, example, target="cortex-m33", calibration=calibration)
    # the program of the model in eval mode: batch norm on its running statistics, dropout off
    assert told.pte == quiet.pte
    notes = [n for n in told.report["notes"] if "training mode" in n]
    assert len(notes) == 1 and "model.eval()" in notes[0], told.report["notes"]
    assert notes[0] in summary_notes(told.report)
    assert not [n for n in quiet.report["notes"] if "training mode" in n]
    # the caller's model is as it was: every submodule still in training mode
    assert all(m.training for m in training.modules())


def test_a_part_left_in_training_mode_is_named() -> None:
    example, calibration = _inputs()
    model = _model().eval()
    model[1].train()  # a forgotten part
    compiled = etforge.compile(model, example, target="cortex-m33", calibration=calibration)
    notes = [n for n in compiled.report["notes"] if "training mode" in n]
    assert len(notes) == 1 and "training mode (1)" in notes[0], notes
    assert model[1].training and not model.training and not model[0].training
