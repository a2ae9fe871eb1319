"""Cortex-M pass lists without idle re-traces (plugins/targets/cortex_m_passes.py).

ExecuTorch's own CortexMPassManager and CortexMQuantizer are the reference: for small models
that make each skippable pass act and not act, the .pte compiled with skipping must equal the
one compiled through the upstream pass manager, byte for byte, and a pass with work on the
graph must never be among the skipped ones.
"""

from __future__ import annotations

import pytest
import torch

import etforge
from etforge.plugins.targets import cortex_m_passes


class PoolHead(torch.nn.Module):
    """conv + relu6 + max_pool2d (a getitem) + flatten + linear: no hardswish, mean, matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.nn.functional.relu6(self.conv(x)), 2)
        return self.fc(torch.flatten(y, 1))


class HardswishMean(torch.nn.Module):
    """conv + hardswish + clamp + spatial mean + linear: no max_pool2d, no matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 1)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.hardswish(self.conv(x))
        y = torch.clamp(self.conv2(y), -1.0, 1.0)
        return self.fc(y.mean(dim=(2, 3)))


class AdaptivePool(torch.nn.Module):
    """conv + relu + adaptive average pool + linear: DecomposeMeanPass's other op."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


class Matmul(torch.nn.Module):
    """Two linears into a batched matmul: MatmulToBmmPass's op, nothing 4-D."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(16, 16)
        self.k = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.q(x), self.k(x).transpose(1, 2))


class ScalarOps(torch.nn.Module):
    """add.Scalar / mul.Scalar called as such: ReplaceScalarWithTensorArgPass's ops."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten.add.Scalar(self.fc(x), 0.5)
        return torch.ops.aten.mul.Scalar(y, 0.25)


T, A = "transform", "annotation"  # CortexMPassManager.transform, transform_for_annotation
RG, RS = "RemoveGetItemPass", "ReplaceScalarWithTensorArgPass"
CH, DM, MB = "ClampHardswishPass", "DecomposeMeanPass", "MatmulToBmmPass"

#: name -> (model class, input shape, passes with work on its graph per list, passes skipped
#: per list). etforge's front end decomposes hardswish before quantization, so ClampHardswishPass
#: is idle on every compile (test_annotation_list_gives_the_upstream_graph makes it act).
CASES: dict[str, tuple[type[torch.nn.Module], tuple[int, ...], dict[str, set[str]], dict[str, list[str]]]] = {
    "pool": (PoolHead, (1, 3, 8, 8), {T: {RG}}, {T: [RS], A: [RS, CH, DM]}),
    # DecomposeMeanPass re-traces: MatmulToBmmPass, idle right after it, is left out too.
    "hardswish_mean": (HardswishMean, (1, 3, 8, 8), {A: {DM}}, {T: [RG, RS], A: [RS, CH, MB]}),
    "adaptive_pool": (AdaptivePool, (1, 3, 8, 8), {A: {DM}}, {T: [RG, RS], A: [RS, CH, MB]}),
    "matmul": (Matmul, (1, 4, 16), {A: {MB}}, {T: [RG, RS], A: [RS, CH, DM]}),
    "scalar_ops": (ScalarOps, (1, 4, 16), {A: {RS}}, {T: [RG, RS], A: [CH, DM, MB]}),
}


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ExecuTorch's own pass manager and quantizer for the block."""
    monkeypatch.setattr(cortex_m_passes, "SKIP", False)


def _compile(name: str) -> tuple[bytes, dict[str, list[str]]]:
    cls, shape, _, _ = CASES[name]
    torch.manual_seed(0)
    model = cls().eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(*shape, generator=g),) for _ in range(3)]
    cortex_m_passes.last_skipped.update(transform=[], annotation=[], in_place=[])
    compiled = etforge.compile(model, calib[0], target="cortex-m33", calibration=calib)
    return compiled.pte, {k: list(v) for k, v in cortex_m_passes.last_skipped.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_skipping_gives_the_upstream_bytes(name: str, request: pytest.FixtureRequest) -> None:
    assert cortex_m_passes.SKIP
    fast, skipped = _compile(name)
    request.getfixturevalue("upstream")
    reference, none = _compile(name)
    assert none == {"transform": [], "annotation": [], "in_place": []}  # the reference path skipped nothing
    assert fast == reference
    _, _, acting, expected = CASES[name]
    for stage in (T, A):
        assert not acting.get(stage, set()) & set(skipped[stage]), f"{stage}: a pass with work was skipped"
        assert skipped[stage] == expected[stage]
    # RemoveGetItemPass with work runs without its re-trace (ReplaceQuantNodesPass re-traces).
    assert skipped["in_place"] == ([RG] if RG in acting.get(T, set()) else [])


def test_the_anchor_is_the_last_always_re_tracing_pass() -> None:
    """The last always-re-tracing pass of each list runs even with nothing to do (unless an
    always-re-tracing pass ran just before it), so every skipped pass is followed by a re-trace."""
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager

    for passes in (
        CortexMPassManager.legacy_pass_list,
        CortexMPassManager.pass_list_transform_for_annotation,
    ):
        names = [p.__name__ for p in passes]
        anchor = cortex_m_passes._anchor(names)
        assert anchor >= 0 and names[anchor] in cortex_m_passes._ALWAYS_RETRACE
        assert all(name not in cortex_m_passes._ALWAYS_RETRACE for name in names[anchor + 1 :])


def test_control_flow_runs_every_pass() -> None:
    """A graph with a cond: the scans do not read subgraphs, so nothing is skipped."""

    class Branch(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))

    gm = torch.export.export(Branch(), (torch.randn(2, 2),)).module()
    assert cortex_m_passes.has_control_flow(gm)
    assert not cortex_m_passes.skippable("MatmulToBmmPass", 0, -1, gm)
    assert not cortex_m_passes.skippable("MatmulToBmmPass", 4, -1, gm, fresh=True)


def test_an_idle_anchor_runs_unless_the_graph_is_fresh_from_a_re_trace() -> None:
    gm = torch.export.export(Plain(), (torch.randn(1, 2, 4, 4),)).module()
    assert not cortex_m_passes.skippable(MB, 4, 4, gm)  # the anchor, nothing re-traced before it
    assert cortex_m_passes.skippable(MB, 4, 4, gm, fresh=True)
    assert not cortex_m_passes.skippable("DeduplicateGetAttrPass", 5, 4, gm, fresh=True)  # not a known pass


class Hardswish(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.hardswish(x) + x.mean(dim=(2, 3), keepdim=True)


class Plain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2.0


class Idle(torch.nn.Module):
    """Nothing for any pre-annotation pass: only the anchor's re-trace (it adds meta) runs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).flatten(1)


@pytest.mark.parametrize(
    ("cls", "acting"),
    [(Hardswish, {"ClampHardswishPass", "DecomposeMeanPass"}), (Plain, set()), (Idle, set())],
)
def test_annotation_list_gives_the_upstream_graph(cls: type[torch.nn.Module], acting: set[str]) -> None:
    # MatmulToBmmPass (the anchor) is left out only right after DecomposeMeanPass re-traced.
    """Straight on an exported graph (etforge's front end leaves no hardswish to clamp): the
    pre-annotation passes give ExecuTorch's graph, node names and values included."""
    import copy

    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager

    gm = torch.export.export(cls(), (torch.randn(1, 2, 4, 4),)).graph_module
    reference = CortexMPassManager(None).transform_for_annotation(copy.deepcopy(gm))
    fast = cortex_m_passes.transform_for_annotation(copy.deepcopy(gm))
    skipped = set(cortex_m_passes.last_skipped["annotation"])
    assert not skipped & acting
    fresh = {MB} if DM in acting else set()
    assert (
        skipped
        == ({"ReplaceScalarWithTensorArgPass", "ClampHardswishPass", "DecomposeMeanPass"} - acting) | fresh
    )
    assert str(fast.graph) == str(reference.graph)
    assert [str(n.meta.get("val")) for n in fast.graph.nodes] == [
        str(n.meta.get("val")) for n in reference.graph.nodes
    ]
