"""report.json tells one story: ``lowering``, ``fallbacks`` and ``stages`` agree, and every
attempt the compile made is there with its time (core/build/session.py, core/lower/driver.py).

Two ways a compile tries twice: a build round redone after an op without a kernel is
decomposed (the LSTM on cortex-m33), and the early lowering giving way to the classic one.
"""

from __future__ import annotations

import pytest
import torch

import etforge
from etforge.core.lower import early as early_module


class Lstm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 8, batch_first=True)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.lstm(x)[0][:, -1])


def test_a_second_build_round_is_in_stages_and_lowering() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    calib = [(torch.randn(1, 5, 6, generator=g),) for _ in range(2)]
    report = etforge.compile(Lstm().eval(), calib[0], target="cortex-m33", calibration=calib).report
    stages = report["stages"]
    for name in ("quantize", "lower", "quantize (round 2)", "lower (round 2)"):
        assert stages.get(name, 0) > 0, stages
    rounds = report["lowering"]["rounds"]
    assert [r["round"] for r in rounds] == [1, 2], rounds
    assert rounds[0]["outcome"].startswith("rebuilt: no kernel for") and rounds[1]["outcome"] == "built"
    assert rounds[-1]["path"] == report["lowering"]["path"]
    # the fallback that caused round 2 is the first one told
    assert report["fallbacks"][0]["stage"] == "kernels" and "lstm" in report["fallbacks"][0]["where"]


def test_the_early_attempt_is_timed_beside_the_classic_lowering(monkeypatch: pytest.MonkeyPatch) -> None:
    from support import conv_head

    monkeypatch.setattr(early_module, "_same_layout", lambda sub, node: False)  # early cannot be exact
    model, batches = conv_head(calibration=3)
    model = model.to(memory_format=torch.channels_last)
    calib = [tuple(t.to(memory_format=torch.channels_last) for t in batch) for batch in batches]
    report = etforge.compile(model, calib[0], target="litert", calibration=calib).report
    lowering = report["lowering"]
    assert lowering["path"] == "classic" and lowering["fallback"], lowering
    assert [a["path"] for a in lowering["attempts"]] == ["early", "classic"], lowering
    assert "stages" in report and report["stages"]["lower: delegate (early attempt)"] >= 0
    assert "lower: delegate (classic)" in report["stages"], report["stages"]
    (fb,) = [f for f in report["fallbacks"] if f["stage"] == "lower"]
    assert fb["what"] == "lowered the classic way (slower)" and fb["why"] == lowering["reason"]
    assert lowering["attempts"][0]["result"] == lowering["reason"]
