"""Differential test against upstream: etforge and ExecuTorch's own NXP flow place the same ops.

Each case of ``neutron_differential_cases.py`` is one op just inside or just outside a limit
upstream's Neutron partitioner checks. Upstream decides in a child process
(``sdk_double/upstream_partition.py``: its quantizer, its Edge passes, its
``NeutronPartitioner``, with the SDK test double so it imports); etforge decides on both
lowering paths (early, the default, and classic) with one quantization per case. The
placement of the case's op nodes (all on the NPU, none, some) must agree, except for the
deliberate differences in :data:`DIFFERENCES`, each listed with its reason in
docs/targets.md, "Differences from upstream" -- where the test requires that they still differ,
so the table cannot go stale.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from neutron_differential_cases import CASES, DCase, Module, inputs

from support import REPO

TARGET = "imxrt700"
DOUBLE = REPO / "tests" / "sdk_double"
DOC = REPO / "docs" / "targets.md"

#: case -> why etforge places it differently from upstream (docs/targets.md has the same table).
DIFFERENCES: dict[str, str] = {
    "maxpool-ceil-mode": "etforge pads (int8 minimum) and runs a floor-mode pool; upstream refuses ceil_mode",
    "softmax-channels-4d": "etforge moves the softmax dim last with transposes inside the partition",
    "pad-constant-negative": "a negative pad crops; LiteRT PAD rejects it, so etforge keeps it on the CPU",
    "avgpool-2": "upstream's avg_pool2d converter indexes a stride argument the default form lacks (IndexError)",
}

#: Upstream's flow runs in a child per module (strict export, its quantizer and passes):
#: ~5 min for all cases on an idle 2-core machine, over 20 min on a loaded one. Opt in.
HEAVY = pytest.mark.skipif(
    not os.environ.get("ETFORGE_DIFFERENTIAL"),
    reason="differential run against upstream is opt-in: set ETFORGE_DIFFERENTIAL=1 (several minutes)",
)


def _placement(flags: list[bool]) -> str:
    if not flags:
        return "absent"
    if all(flags):
        return "npu"
    return "cpu" if not any(flags) else "mixed"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    out = tmp_path_factory.mktemp("upstream") / "decisions.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(DOUBLE), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(DOUBLE / "upstream_partition.py"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
        cwd=out.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _etforge(case: DCase) -> dict[str, str]:
    from etforge.core import pipeline
    from etforge.core.plugin_manager import registry

    reg = registry()
    tgt = reg.target(TARGET)
    torch.manual_seed(0)
    example = inputs(case, 0)
    ep = pipeline.export(Module(case).eval(), example)
    ep, _ = pipeline.rewrite(ep, tgt, reg)
    q = pipeline.quantize(ep, tgt, [inputs(case, s) for s in range(3)], reg)  # shared by both paths
    out = {}
    for path, early in (("early", True), ("classic", False)):
        _, part, _, _ = pipeline.lower(pipeline.clone_program(q), tgt, None, reg, early=early)
        out[path] = _placement([d.npu for d in part.decisions if d.op == case.op])
    return out


@pytest.fixture(scope="module")
def etforge() -> dict[str, dict[str, str]]:
    return {case.id: _etforge(case) for case in CASES}


def test_enough_cases() -> None:
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)


@HEAVY
@pytest.mark.parametrize("path", ["early", "classic"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_same_placement_as_upstream(
    case: DCase, path: str, upstream: dict[str, dict[str, object]], etforge: dict[str, dict[str, str]]
) -> None:
    up = upstream[case.id]
    theirs = "error" if "error" in up else _placement([bool(i < up["delegated"]) for i in range(up["nodes"])])  # type: ignore[operator]
    ours = etforge[case.id][path]
    if case.id in DIFFERENCES:
        assert ours != theirs, (
            f"{case.id}: now agrees with upstream ({ours}); drop it from DIFFERENCES and the docs"
        )
    else:
        assert ours == theirs, f"{case.id} ({path}): etforge {ours}, upstream {theirs} {up.get('error', '')}"


def test_differences_are_documented() -> None:
    text = DOC.read_text()
    section = text[text.index("## Differences from upstream") :]
    documented = set(re.findall(r"^\| `([\w.-]+)` \|", section, re.M))
    assert set(DIFFERENCES) <= documented, sorted(set(DIFFERENCES) - documented)
