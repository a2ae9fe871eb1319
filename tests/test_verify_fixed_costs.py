"""verify's fixed costs (issue 47): what it recomputes and what it takes on the hash chain's word,
each told; a float check that could not fold conv + BatchNorm says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import ExportedProgram

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


def _unstrippable() -> ExportedProgram:
    """A program whose quantize feeds an integer op: no quantize / dequantize pair to remove."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    class Codes(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
            return q.to(torch.int32) + 1

    return torch.export.export(Codes(), (torch.randn(1, 8),))


class _ConvBn(_ConvBnNone):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.relu(self.bn(self.conv(x)))


def test_the_float_check_runs_on_the_compiled_partitions(tmp_path: Path) -> None:
    """By default the float check strips the rebuilt program's NPU partitions of their
    quantize / dequantize pairs and converts them in float (no second lowering): the same NPU
    ops as lowering float.pt2 again (its BatchNorm folded), all within FLOAT_REL_TOL; verify
    --json says which ran."""
    import etforge
    from etforge.core.build import output
    from etforge.core.front.load import load_program
    from etforge.core.registry.manager import registry
    from etforge.runtime.verification import float_check
    from etforge.runtime.verification.verify import _inputs, verify

    calib = [(torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(i)),) for i in range(4)]
    etforge.compile(_ConvBn().eval(), calib[0], target="imxrt700cm", calibration=calib).save(tmp_path)
    v = verify(tmp_path, samples=4)
    assert v.ok, v.failures
    assert v.float_check_source == "partitions" and v.float_check_unfolded is None
    report = output.load_report(tmp_path / "report.json")
    again = float_check.check_float_program(
        load_program(tmp_path / "float.pt2"),
        registry().target("imxrt700cm"),
        None,
        registry(),
        _inputs(report, 0, 4),
    )
    assert v.float_ops == len(again) == 1  # conv + BatchNorm + ReLU: one NPU op
    assert v.float_max_rel is not None and v.float_max_rel <= float_check.FLOAT_REL_TOL
    proc = cli_in_process("verify", str(tmp_path), "--samples", "2", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout[proc.stdout.index("{") :])["float_check_source"] == "partitions"


def test_a_partition_that_cannot_be_stripped_falls_back_to_float_pt2_and_says_so(unfoldable: Path) -> None:
    """A delegate whose program has no removable quantize / dequantize pair: the float check
    lowers float.pt2 as before and says why; that program's BatchNorm cannot be folded there
    (its forward returns None beside the tensor): said too, field, note and all."""
    import types

    from etforge.core.build import output
    from etforge.core.front.load import load_program
    from etforge.runtime.verification.float_partitions import NotStrippable, stripped
    from etforge.runtime.verification.verify import Verification, _float_check
    from etforge.runtime.verification.verify_steps import Steps

    bad = _unstrippable()
    with pytest.raises(NotStrippable, match="feeds something other than a dequantize or the output"):
        stripped(bad)
    report = output.load_report(unfoldable / "report.json")
    payload = (unfoldable / "partitions" / "etforge_0.tflite").read_bytes()
    from etforge.core.litert.payload import FORMAT_LITERT_HOST, pack

    lowered = types.SimpleNamespace(
        processed_bytes=pack(FORMAT_LITERT_HOST, "etforge_0", True, payload), original_module=bad
    )
    result = Verification(2, None, None, None, None, None, 0.0, False)
    _float_check(result, load_program(unfoldable / "float.pt2"), report, 2, 0, Steps(), [[(lowered, [])]])
    assert result.float_check_source == "float.pt2" and result.float_ops >= 1 and not result.failures
    assert [
        n for n in result.notes if n.startswith("float check: lowered float.pt2 again: a partition could not")
    ]
    why = result.float_check_unfolded
    assert why is not None and "1 conv + BatchNorm pair(s) not folded" in why
    assert "an output is not a tensor of the graph" in why
    assert [
        n for n in result.notes if n.startswith("float check ran on the unfolded float program") and why in n
    ]


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
    chain holds: the saved lowered program's payload names the file; changed there too, the NPU-op
    gate (each op against its device-exact reference from quantized.pt2's Edge op) names the op;
    --reconvert fails at the rebuild."""
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
    # the saved lowered program (lowered_edge.exir) still holds the compiled partition: named
    with pytest.raises(EtforgeError, match=r"etforge_0\.tflite: does not match partition etforge_0's model"):
        verify(out, samples=2)
    # changed alike in lowered_edge.exir too, its hash forged as well: the NPU-op gate names the op
    from etforge.core.serialize.lowered_program import load_lowered, to_bytes
    from etforge.runtime.verification.saved_program import delegates

    ep = load_lowered(out / "lowered_edge.exir")
    (lowered,) = delegates(ep)
    raw = bytes(lowered.processed_bytes)
    assert raw.count(tflite) == 1
    lowered._processed_bytes = raw.replace(tflite, changed)
    (out / "lowered_edge.exir").write_bytes(to_bytes(ep))
    _rehash(out)
    v = verify(out, samples=2)
    assert not v.ok and v.lowered_source == "saved"
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


def test_an_int8_only_converter_is_not_asked_to_convert_float() -> None:
    """A ReLU converter that declares int8 only (and refuses anything else) wins the int8
    partition; in float the op's converter is chosen again for float32 (the built-in one),
    so the float check still runs on the compiled partitions, not the float.pt2 fallback."""
    from test_gates import _compare, _plugin, _relu_calibration, _ReluPlusInput

    from etforge.core.common.errors import ConversionError
    from etforge.core.contracts.converter import OpConverter

    class Int8Relu(OpConverter):
        ops = ("aten.relu.default",)
        targets = ("neutron-c",)
        priority = 10
        litert_ops = ("RELU",)
        dtypes = ("int8",)

        def convert(self, node: Any, ctx: Any) -> None:
            x = ctx.input(node.args[0])
            if x.dtype != "int8":
                raise ConversionError(node, "relu", f"{x.dtype}: int8 only")
            ctx.emit("RELU", [x], [ctx.output(node, x.perm)])

    v = _compare(
        _ReluPlusInput(), _relu_calibration(), "imxrt700", _plugin("int8_relu", Int8Relu()), samples=4
    )
    assert v.ok, v.failures
    assert v.float_check_source == "partitions", v.notes
    assert not [n for n in v.notes if n.startswith("float check: lowered")]
    assert v.float_ops > 0
