"""verify's top-1 agreement: ties on an int8 output step are not disagreements."""

from __future__ import annotations

import torch

from etforge.runtime.verify import top1_agrees


def test_top1_counts_a_tie_on_either_side_as_agreement() -> None:
    ref = torch.tensor([[0.25, 0.25, 0.125]])  # the reference cannot tell class 0 from 1
    assert top1_agrees(torch.tensor([[0.25, 0.2578, 0.125]]), ref)
    ours = torch.tensor([[0.5, 0.5, 0.0]])  # ours ties; the reference picks class 1
    assert top1_agrees(ours, torch.tensor([[0.1, 0.3, 0.2]]))


def test_top1_disagreement_is_caught() -> None:
    ref = torch.tensor([[0.25, 0.2578, 0.125], [0.0, 1.0, 0.5]])
    assert top1_agrees(ref, ref)
    flipped = torch.tensor([[0.2578, 0.25, 0.125], [0.0, 1.0, 0.5]])  # row 0: a real 1-step flip
    assert not top1_agrees(flipped, ref)
