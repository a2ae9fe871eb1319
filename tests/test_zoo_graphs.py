"""Whole networks convert as one LiteRT model that matches the PT2E quantized reference."""

from __future__ import annotations

import pytest
import torch

from etforge import zoo
from etforge.core.build import pipeline
from etforge.core.registry.manager import registry
from etforge.runtime.host import run_program
from etforge.testing import check_op


@pytest.mark.parametrize("name", ["cifarnet", "resnet8"])
def test_zoo_model_is_one_litert_partition_matching_reference(name: str) -> None:
    model, example = zoo.build(name)
    calib = zoo.calibration(name, 16)
    result = check_op(model, example, target="litert", calibration=calib, max_steps=2.0)
    assert not result.refused
    # top-1 agreement on 32 seeded inputs, through the same lowered program
    reg = registry()
    target = reg.target("litert")
    qep = pipeline.quantize(pipeline.export(model, example), target, calib, reg)
    edge, _, parts, _ = pipeline.lower(qep, target, None, reg)
    assert len(parts) == 1
    g = torch.Generator().manual_seed(1234)
    reference = qep.module()
    agree = 0
    for _ in range(32):
        x = torch.randn(example[0].shape, generator=g)
        ours = run_program(edge.exported_program(), (x,))[0]
        ref = reference(x)
        agree += int(ours.argmax() == ref.argmax())
    assert agree >= 31, f"top-1 agreement {agree}/32"


def test_zoo_models_have_healthy_activations() -> None:
    for name in zoo.ZOO:
        if name == "mobilenet_v2":
            continue  # 224x224: covered by the benchmarks
        model, example = zoo.build(name)
        with torch.no_grad():
            out = model(*example)
        assert out.std() > (1e-3 if name == "cifarnet" else 1e-2), name  # cifarnet ends in softmax
