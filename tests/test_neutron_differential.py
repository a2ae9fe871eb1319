"""Differential test against upstream: etforge and ExecuTorch's own NXP flow place the same ops.

Each case of ``neutron_differential_cases.py`` is one op just inside or just outside a limit
upstream's Neutron partitioner checks. Upstream decides in ONE child process for all cases
(``sdk_double/upstream_partition.py``: its quantizer, ``to_edge_transform_and_lower`` with its
Edge passes and its ``NeutronPartitioner``, beside the SDK test double so it imports), started
first so it runs while etforge decides here, on both lowering paths (early, the default, and
classic) with one export and one quantization per case. The placement of the case's op nodes
(all on the NPU, none, some) must agree, except for the deliberate differences in
:data:`DIFFERENCES`, each listed with its reason in docs/targets.md, "Differences from
upstream"; for those the test requires exactly the listed placements, so the table cannot go
stale. Nothing is skipped: an etforge crash or an upstream error is a placement of its own.
Both sides lower one small program after another: torch's collection of composite ops is
memoized (``cia_memo.py``) and the collector tuned as the etforge command tunes its own (here
by conftest for every test process, in upstream's child by the child), which cut the fixture's
CPU by about a third (issue 47) and changes no decision.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import cia_memo
import pytest
import torch
from neutron_differential_cases import CASES, DCase, Module, inputs, matches

from support import REPO

TARGET = "imxrt700"
DOUBLE = REPO / "tests" / "sdk_double"
DOC = REPO / "docs" / "targets.md"
PATHS = ("early", "classic")

#: case -> (etforge's placement on both paths, upstream's, why); docs/targets.md has the same rows.
DIFFERENCES: dict[str, tuple[str, str, str]] = {
    # etforge stricter on purpose
    "pad-constant-negative": (
        "cpu",
        "npu",
        "a negative pad crops; LiteRT's PAD rejects negative paddings, so etforge keeps it on the CPU",
    ),
    # etforge delegates more on purpose: a rewrite makes the op legal
    "maxpool-ceil-mode": (
        "npu",
        "cpu",
        "etforge pads with the int8 minimum ahead of a floor-mode MAX_POOL_2D; upstream refuses ceil_mode",
    ),
    "softmax-channels-4d": (
        "npu",
        "cpu",
        "etforge moves a non-last softmax dim last with TRANSPOSEs inside the partition",
    ),
    "relu6": (
        "npu",
        "cpu",
        "upstream's quantizer has no pattern for aten.relu6 (only aten.hardtanh), so a lone F.relu6 stays float",
    ),
    # upstream fails
    "avgpool-2": (
        "npu",
        "error",
        "upstream's avg_pool2d converter reads node.args[2] (stride), absent from F.avg_pool2d(x, 2): IndexError",
    ),
}


def _placement(flags: list[bool]) -> str:
    if not flags:
        return "absent"
    if all(flags):
        return "npu"
    return "cpu" if not any(flags) else "mixed"


def upstream_placement(up: dict[str, object]) -> str:
    if "error" in up:
        return "error"
    return _placement([flag for op, flag in up["all"] if matches(_case(up["id"]), op)])  # type: ignore[index, union-attr, arg-type]


def _case(case_id: object) -> DCase:
    return next(c for c in CASES if c.id == case_id)


@pytest.fixture(scope="module")
def upstream_child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """Upstream's decisions for every case, computed in one child started before etforge's side."""
    out = tmp_path_factory.mktemp("upstream") / "decisions.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(DOUBLE), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    log = out.with_suffix(".log").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(DOUBLE / "upstream_partition.py"), str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=out.parent,
    )
    yield proc, out
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    log.close()


def _etforge(case: DCase) -> dict[str, str]:
    from etforge.core.build import pipeline
    from etforge.core.registry.manager import registry

    reg = registry()
    tgt = reg.target(TARGET)
    torch.manual_seed(0)
    try:
        ep = pipeline.export(Module(case).eval(), inputs(case, 0))
        ep, _ = pipeline.rewrite(ep, tgt, reg)
        q = pipeline.quantize(ep, tgt, [inputs(case, s) for s in range(3)], reg)  # shared by both paths
    except Exception as exc:  # a crash is a result: the case fails naming it
        return dict.fromkeys(PATHS, f"crash: {type(exc).__name__}: {exc}"[:300])
    out = {}
    for path in PATHS:
        try:
            _, part, _, _ = pipeline.lower(pipeline.clone_program(q), tgt, None, reg, early=path == "early")
            out[path] = _placement([d.npu for d in part.decisions if matches(case, d.op)])
        except Exception as exc:
            out[path] = f"crash: {type(exc).__name__}: {exc}"[:300]
    return out


@pytest.fixture(scope="module")
def etforge(upstream_child: tuple[subprocess.Popen[str], Path]) -> dict[str, dict[str, str]]:
    # torch collects the composite ops once, not per run_decompositions (tests/cia_memo.py)
    with cia_memo.memoized():
        return {case.id: _etforge(case) for case in CASES}


@pytest.fixture(scope="module")
def upstream(
    upstream_child: tuple[subprocess.Popen[str], Path], etforge: dict[str, dict[str, str]]
) -> dict[str, dict[str, object]]:
    proc, out = upstream_child
    code = proc.wait()
    assert code == 0, out.with_suffix(".log").read_text()[-3000:]
    decided = json.loads(out.read_text())
    return {k: {**v, "id": k} for k, v in decided.items()}


def test_enough_cases() -> None:
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_same_placement_as_upstream(
    case: DCase, path: str, etforge: dict[str, dict[str, str]], upstream: dict[str, dict[str, object]]
) -> None:
    up = upstream[case.id]
    theirs = upstream_placement(up)
    ours = etforge[case.id][path]
    assert ours != "absent", f"{case.id} ({path}): no {case.op} node on etforge's side"
    if case.id in DIFFERENCES:
        want_ours, want_theirs, _ = DIFFERENCES[case.id]
        assert (ours, theirs) == (want_ours, want_theirs), (
            f"{case.id} ({path}): etforge {ours}, upstream {theirs}; DIFFERENCES (and docs/targets.md) "
            f"say etforge {want_ours}, upstream {want_theirs}"
        )
    else:
        assert theirs != "absent", f"{case.id}: no {case.op} node on upstream's side: {up.get('all')}"
        assert ours == theirs, f"{case.id} ({path}): etforge {ours}, upstream {theirs} {up.get('error', '')}"


def test_memo_changes_no_collection_or_decomposition() -> None:
    """cia_memo (both sides run under it) changes what torch collects and decomposes in
    nothing, sees an op registered after its first collection, and puts torch back."""
    import torch._export.utils as export_utils
    import torch._ops
    from torch.export import exported_program

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(x).flatten(1) @ x.flatten(1).T

    ep = torch.export.export(Probe(), (torch.randn(2, 3, 4),))
    own = export_utils._collect_all_valid_cia_ops(), ep.run_decompositions().graph_module.code
    py_impl, collect = torch._ops.OperatorBase.py_impl, exported_program._collect_all_valid_cia_ops
    lib = torch.library.Library("etforge_memo_probe", "DEF")
    try:
        with cia_memo.memoized():
            memo = exported_program._collect_all_valid_cia_ops(), ep.run_decompositions().graph_module.code
            lib.define("twice(Tensor x) -> Tensor")
            lib.impl("twice", lambda x: x + x, "CompositeImplicitAutograd")
            later = exported_program._collect_all_valid_cia_ops()
    finally:
        lib._destroy()
    assert memo == own
    assert {str(op) for op in later - memo[0]} == {"etforge_memo_probe.twice.default"}
    assert (torch._ops.OperatorBase.py_impl, exported_program._collect_all_valid_cia_ops) == (
        py_impl,
        collect,
    )


def test_differences_are_documented() -> None:
    text = DOC.read_text()
    section = text[text.index("## Differences from upstream") :]
    rows = {
        m[0]: (m[1].lower(), m[2].lower())
        for m in re.findall(r"^\| `([\w.-]+)` \| (\w+) \| (\w+) \|", section, re.M)
    }
    assert {k: v[:2] for k, v in DIFFERENCES.items()} == {k: rows.get(k) for k in DIFFERENCES}
    assert set(rows) <= set(DIFFERENCES), sorted(set(rows) - set(DIFFERENCES))
