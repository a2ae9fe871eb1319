"""The bare ExecuTorch flow every bench compares etforge with: what a user writes without a backend.

``torch.export``, PT2E with ExecuTorch's XNNPACK quantizer, calibration, ``convert_pt2e``, a
re-export, a partitioner-free ``to_edge_transform_and_lower``, ``to_executorch``. One copy,
run in-process (bench/realworld.py) or as its own process (bench/process.py,
bench/realworld_process.py):

    python bench/bare_flow.py zoo:NAME CALIBRATION OUT.pte   # the zoo model, N calibration samples
    python bench/bare_flow.py FILE.py OUT.pte                # FILE's build() -> (model, example, calibration)

Imports only what the flow needs (nothing of etforge but its zoo), so a process pays what a
user's script would.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch


def pte(model: torch.nn.Module, example: tuple[torch.Tensor, ...], calibration: Sequence[Any]) -> bytes:
    """The ``.pte`` of the bare flow on ``model``."""
    import executorch.kernels.quantized  # noqa: F401  (out variants of the q/dq ops)
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    ep = torch.export.export(model, example, strict=False)
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    gm = prepare_pt2e(ep.module(check_guards=False), q)
    with torch.no_grad():
        for batch in calibration:
            gm(*batch)
    gm = convert_pt2e(gm)
    return to_edge_transform_and_lower(torch.export.export(gm, example, strict=False)).to_executorch().buffer


def _load(argv: list[str]) -> tuple[tuple[Any, ...], str]:
    if argv[0].startswith("zoo:"):
        from etforge import zoo

        name = argv[0][4:]
        model, example = zoo.build(name)
        return (model, example, zoo.calibration(name, int(argv[1]))), argv[2]
    import importlib.util

    spec = importlib.util.spec_from_file_location("bare_flow_model", argv[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(), argv[1]


if __name__ == "__main__":
    (model, example, calibration), out = _load(sys.argv[1:])
    with open(out, "wb") as f:
        f.write(pte(model, example, calibration))
