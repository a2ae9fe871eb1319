"""The same proof through the pytest fixture etforge registers (entry point pytest11)."""

import torch


def test_floor_with_fixture(etforge_check) -> None:  # noqa: ANN001
    result = etforge_check(torch.nn.Sequential(torch.nn.Identity()), (torch.randn(3, 4),), target="toy-npu", quantize=False,
                           expect_delegated=False)  # fmt: skip
    assert result.max_rel == 0.0
