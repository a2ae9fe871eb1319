"""verify's fixed costs (issue 47): what it recomputes and what it takes on the hash chain's word,
each told; a float check that could not fold conv + BatchNorm says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from support import REPO, cli_in_process


class _ConvBnNone(torch.nn.Module):
    """conv + BatchNorm whose forward also returns None: the folded graph has a non-tensor
    output, which the direct rebuild of a program (``core.graph.program``) refuses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.relu(self.bn(self.conv(x))), None


@pytest.fixture(scope="module")
def unfoldable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import etforge

    out = tmp_path_factory.mktemp("unfoldable")
    calib = [(torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(i)),) for i in range(4)]
    etforge.compile(_ConvBnNone().eval(), calib[0], target="imxrt700cm", calibration=calib).save(out)
    return out


def test_a_float_check_that_cannot_fold_batch_norm_says_so(unfoldable: Path) -> None:
    """The float check falls back to the unfolded float program: the result, its note and
    ``verify --json`` name why; the gate still ran on every NPU op and held."""
    from etforge.runtime.verification.verify import verify

    v = verify(unfoldable, samples=2)
    assert v.ok, v.failures
    why = v.float_check_unfolded
    assert why is not None and "1 conv + BatchNorm pair(s) not folded" in why
    assert "an output is not a tensor of the graph" in why
    assert [n for n in v.notes if n.startswith("float check ran on the unfolded float program") and why in n]
    assert v.float_ops >= 1  # the unfolded program's NPU ops were still checked
    proc = cli_in_process("verify", str(unfoldable), "--samples", "2", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout[proc.stdout.index("{") :])["float_check_unfolded"] == why


def test_a_foldable_program_reports_no_fallback(unfoldable: Path) -> None:
    """The same conv + BatchNorm returning only its tensor folds: nothing to tell."""
    from etforge.runtime.verification.float_program import fold

    class Plain(_ConvBnNone):
        def forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
            return torch.relu(self.bn(self.conv(x)))

    x = torch.randn(1, 3, 8, 8)
    ep = torch.export.export(Plain().eval(), (x,))
    program, folds, why = fold(ep)
    assert (folds, why) == (1, None)
    _, none_folds, none_why = fold(torch.export.export(_ConvBnNone().eval(), (x,)))
    assert none_folds == 0 and none_why is not None and "not folded" in none_why


@pytest.fixture(scope="module")
def small_npu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/models/user_models.py's small model compiled for imxrt700 (one NPU partition)."""
    import importlib.util

    import etforge

    spec = importlib.util.spec_from_file_location("user_models", REPO / "tests" / "models" / "user_models.py")
    assert spec is not None and spec.loader is not None
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    model, example, calib = models.small()
    out = tmp_path_factory.mktemp("small")
    etforge.compile(model, example, target="imxrt700", calibration=calib).save(out)
    return out


def _rehash(out: Path) -> None:
    """report.json's hashes made to match the files as they are now (a forged chain)."""
    import hashlib

    report = json.loads((out / "report.json").read_text())
    report["pte_sha256"] = hashlib.sha256((out / "model.pte").read_bytes()).hexdigest()
    for name in report["files_sha256"]:
        report["files_sha256"][name] = hashlib.sha256((out / name).read_bytes()).hexdigest()
    (out / "report.json").write_text(json.dumps(report))


def test_the_partitions_are_taken_on_the_hash_chain_unless_reconverted(small_npu: Path) -> None:
    """By default the rebuild takes partitions/*.tflite as converted and says so (field and
    note); --reconvert converts again, compares, and says that instead."""
    from etforge.runtime.verification.verify import verify

    v = verify(small_npu, samples=2)
    assert v.ok, v.failures
    assert v.partitions_by_hash == ["partitions/etforge_0.tflite"] and v.partitions_reconverted == []
    assert [n for n in v.notes if "etforge_0.tflite: taken as converted on report.json's sha256" in n]
    again = verify(small_npu, samples=2, reconvert=True)
    assert again.ok, again.failures
    assert again.partitions_by_hash == [] and again.partitions_reconverted == ["partitions/etforge_0.tflite"]
    assert not [n for n in again.notes if "taken as converted" in n]
    proc = cli_in_process("verify", str(small_npu), "--samples", "2", "--reconvert", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout[proc.stdout.index("{") :])["partitions_reconverted"] == [
        "partitions/etforge_0.tflite"
    ]


def test_a_partition_changed_with_its_payload_and_every_hash_fails_by_default_and_reconverted(
    small_npu: Path, tmp_path: Path
) -> None:
    """The NPU weights changed alike in partitions/etforge_0.tflite and in model.pte's payload,
    report.json's hashes forged to match: the payload-bytes gate sees equal bytes and the hash
    chain holds, so by default the NPU-op gate (each op against its device-exact reference
    from quantized.pt2's Edge op) names the op; --reconvert fails at the rebuild."""
    import shutil

    from ai_edge_litert import schema_py_generated as schema

    from etforge.core.common.errors import EtforgeError
    from etforge.runtime.verification.verify import verify

    out = tmp_path / "out"
    shutil.copytree(small_npu, out)
    part = out / "partitions" / "etforge_0.tflite"
    tflite = part.read_bytes()
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(tflite, 0))
    weights = max((bytes(b.data) for b in model.buffers if b.data is not None), key=len)
    assert tflite.count(weights) == 1
    changed = tflite.replace(weights, bytes(b ^ 0x40 for b in weights))
    pte = (out / "model.pte").read_bytes()
    assert pte.count(tflite) == 1
    (out / "model.pte").write_bytes(pte.replace(tflite, changed))
    part.write_bytes(changed)
    _rehash(out)
    v = verify(out, samples=2)
    assert not v.ok
    assert [f for f in v.failures if f.startswith("NPU op etforge_0:") and "device-exact reference" in f], (
        v.failures
    )
    with pytest.raises(EtforgeError, match=r"etforge_0\.tflite: does not match the program rebuilt"):
        verify(out, samples=2, reconvert=True)


def test_reconvert_is_refused_beside_the_device_runtime(tmp_path: Path) -> None:
    """--reconvert changes the host rebuild only: with --runtime qemu-m33 it is a usage error,
    not a flag silently ignored."""
    proc = cli_in_process("verify", str(tmp_path), "--runtime", "qemu-m33", "--reconvert")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--reconvert goes with the host verification" in proc.stderr + proc.stdout
