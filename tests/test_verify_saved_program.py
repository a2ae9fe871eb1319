"""verify runs the lowered program the compile saved (``lowered_edge.exir``) instead of lowering
``quantized.pt2`` again, and every gate still holds it: the same verification as the lowering
gives (every compared value, on models with the ops that matter), a changed saved program fails
by default (the ``.pte`` = Edge gate) and under ``--rebuild`` (not the program lowered again),
an output without the file is lowered again and says so, the file is byte-identical across
compiles and comes with a cached compile too."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from support import REPO, run_cli

MIXED = f"{REPO / 'tests' / 'models' / 'saved_program_models.py'}:mixed"
LOWERED = "lowered_edge.exir"
TWO_PARTITIONS = "mixed, its concat kept off the NPU"


def _compile(out: Path, model: str, target: str, *extra: str) -> Path:
    proc = run_cli("compile", model, "--target", target, "-o", str(out), *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _verify(out: Path, **kw: Any) -> Any:
    from etforge.runtime.verification.verify import verify

    return verify(out, samples=4, **kw)


def _compared(v: Any) -> dict[str, Any]:
    """Every field a gate or figure reads (times, notes and which program ran left out)."""
    d = dataclasses.asdict(v)
    for k in ("seconds", "notes", "lowered_source"):
        d.pop(k)
    d["pte"].pop("seconds_per_sample")
    return d


@pytest.fixture(scope="module")
def m33(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compile(tmp_path_factory.mktemp("m33"), MIXED, "cortex-m33", "--no-cache")


def _copy(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(src, out)
    return out


def _rehash(out: Path, name: str) -> None:
    report = json.loads((out / "report.json").read_text())
    report["files_sha256"][name] = hashlib.sha256((out / name).read_bytes()).hexdigest()
    (out / "report.json").write_text(json.dumps(report))


@pytest.mark.parametrize(
    ("model", "target"),
    [
        (MIXED, "cortex-m33"),  # concat, mul, sigmoid, depthwise, avgpool, residual, softmax on CMSIS-NN
        pytest.param(MIXED, "imxrt700cm", marks=pytest.mark.slow),  # the same on the NPU
        pytest.param("zoo:cifarnet", "imxrt700cm", marks=pytest.mark.slow),  # conv, maxpool, linear; softmax
        pytest.param("zoo:resnet8", "cortex-m33", marks=pytest.mark.slow),  # residual adds, global avg pool
        pytest.param("zoo:ds_cnn", "cortex-m33", marks=pytest.mark.slow),  # depthwise-separable, 10x4 kernel
        pytest.param(TWO_PARTITIONS, "imxrt700cm", marks=pytest.mark.slow),  # concat on the CPU between two
    ],
)
def test_the_saved_program_gives_the_verification_lowering_again_gives(
    model: str, target: str, m33: Path, tmp_path: Path
) -> None:
    if (model, target) == (MIXED, "cortex-m33"):
        out = m33
    elif model == TWO_PARTITIONS:
        option = "operators_not_to_delegate=aten.cat.default"
        out = _compile(tmp_path / "o", MIXED, target, "--option", option)
        assert len(json.loads((out / "report.json").read_text())["partitions"]) == 2
    else:
        out = _compile(tmp_path / "o", model, target)
    saved, again = _verify(out), _verify(out, lower_again=True)
    assert saved.lowered_source == "saved" and again.lowered_source == "lowered again"
    assert saved.ok and again.ok, saved.failures + again.failures  # --rebuild: the same program
    assert _compared(saved) == _compared(again)
    assert saved.ops and saved.pte is not None and saved.pte.agreed == saved.pte.samples


def test_a_changed_saved_program_fails_by_default_and_under_rebuild(m33: Path, tmp_path: Path) -> None:
    """One CPU op's quantization scale changed in lowered_edge.exir (the output's dequantize),
    report.json's hash updated to match: the .pte = Edge gate fails it (model.pte is the
    compiled program); --rebuild names the file as not the program lowered again."""
    from etforge.core.serialize.lowered_program import load_lowered, to_bytes
    from etforge.runtime.execution.cpu_libraries import host_libraries

    out = _copy(m33, tmp_path)
    host_libraries()
    ep = load_lowered(out / LOWERED)
    (ret,) = (n for n in ep.graph.nodes if n.op == "output")
    deq = ret.args[0][0]
    assert "dequantize" in str(deq.target), deq.target
    scale = deq.args[1] if len(deq.args) > 1 else deq.kwargs["scale"]
    if len(deq.args) > 1:
        deq.args = (deq.args[0], scale * 1.5, *deq.args[2:])
    else:
        deq.kwargs = {**deq.kwargs, "scale": scale * 1.5}
    ep.graph_module.recompile()
    (out / LOWERED).write_bytes(to_bytes(ep))
    _rehash(out, LOWERED)

    v = _verify(out)
    assert v.lowered_source == "saved"
    assert not v.ok
    assert any("model.pte differs from the Edge program on 4/4 samples" in f for f in v.failures), v.failures

    again = _verify(out, lower_again=True)
    assert not again.ok
    assert any(f"{LOWERED}: not the program lowered again from quantized.pt2" in f for f in again.failures), (
        again.failures
    )


def test_a_saved_program_changed_without_its_hash_is_named(m33: Path, tmp_path: Path) -> None:
    from etforge.core.common.errors import EtforgeError

    out = _copy(m33, tmp_path)
    data = bytearray((out / LOWERED).read_bytes())
    data[len(data) // 2] ^= 1
    (out / LOWERED).write_bytes(bytes(data))
    with pytest.raises(EtforgeError, match=r"lowered_edge\.exir is not the file its report\.json records"):
        _verify(out)


def test_an_output_without_the_saved_program_is_lowered_again_and_says_so(m33: Path, tmp_path: Path) -> None:
    """An older compile's output: no lowered_edge.exir in its hash chain."""
    out = _copy(m33, tmp_path)
    (out / LOWERED).unlink()
    report = json.loads((out / "report.json").read_text())
    del report["files_sha256"][LOWERED]
    (out / "report.json").write_text(json.dumps(report))
    v = _verify(out)
    assert v.ok, v.failures
    assert v.lowered_source == "lowered again"
    assert any(f"has no {LOWERED} in its hash chain" in n for n in v.notes), v.notes


@pytest.mark.slow
def test_the_saved_program_is_the_same_bytes_from_two_compiles_and_from_the_cache(
    m33: Path, tmp_path: Path
) -> None:
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(tmp_path / "cache")}
    first = run_cli("compile", MIXED, "--target", "cortex-m33", "-o", str(tmp_path / "a"), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    cached = run_cli("compile", MIXED, "--target", "cortex-m33", "-o", str(tmp_path / "b"), env=env)
    assert cached.returncode == 0, cached.stdout + cached.stderr
    assert json.loads((tmp_path / "b" / "report.json").read_text())["cache"]["mode"] != "miss", (
        "not a cache hit"
    )
    for out in (tmp_path / "a", tmp_path / "b"):
        assert (out / LOWERED).read_bytes() == (m33 / LOWERED).read_bytes(), out
        assert _verify(out).lowered_source == "saved"


@pytest.mark.parametrize("damage", ["not an archive", "a program that is not its annotations"])
def test_a_damaged_saved_program_with_its_hash_forged_is_named_in_one_line(
    damage: str, m33: Path, tmp_path: Path
) -> None:
    import io
    import zipfile

    from etforge.core.common.errors import EtforgeError

    out = _copy(m33, tmp_path)
    if damage == "not an archive":
        (out / LOWERED).write_bytes(b"not a zip archive")
        expected = r"lowered_edge\.exir: not a lowered program etforge saved"
    else:
        buf = io.BytesIO()
        with zipfile.ZipFile(out / LOWERED) as src, zipfile.ZipFile(buf, "w") as dst:
            for info in src.infolist():
                data = src.read(info.filename)
                if info.filename == "serialized_exported_program.json":
                    data = data.replace(b'"target": "', b'"target": "no_such_op::', 1)
                dst.writestr(info, data)
        (out / LOWERED).write_bytes(buf.getvalue())
        expected = r"lowered_edge\.exir: .*; recompile"
    _rehash(out, LOWERED)
    with pytest.raises(EtforgeError, match=expected):
        _verify(out)


def test_a_saved_program_the_deserializer_refuses_is_lowered_again_and_told(
    m33: Path, tmp_path: Path
) -> None:
    """A program ExecuTorch's serializer writes but cannot read back (a constant output), or one
    damaged with its hash forged: verify lowers quantized.pt2 again, which checks at least as much,
    says why, and still fails a --rebuild comparison it cannot make only as a note."""
    import io
    import zipfile

    out = _copy(m33, tmp_path)
    buf = io.BytesIO()
    with zipfile.ZipFile(out / LOWERED) as src, zipfile.ZipFile(buf, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "serialized_exported_program.json":
                data = data[: len(data) // 2]  # what the deserializer cannot read
            dst.writestr(info, data)
    (out / LOWERED).write_bytes(buf.getvalue())
    _rehash(out, LOWERED)
    v = _verify(out)
    assert v.ok, v.failures
    assert v.lowered_source == "lowered again"
    assert any(
        "lowered_edge.exir: cannot be read" in n and "lowered quantized.pt2 again" in n for n in v.notes
    ), v.notes
    assert not any("older etforge" in n for n in v.notes), v.notes


class _Planted:
    """Pickles to a call that creates ``marker`` when unpickled (what a planted file would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("member", ["serialized_example_inputs.pt", "serialized_constants.pt"])
def test_the_saved_program_is_loaded_tensors_only(member: str, m33: Path, tmp_path: Path) -> None:
    """A pickle planted in lowered_edge.exir (its hash forged) is refused, naming the file; it never runs."""
    import io
    import zipfile

    import torch

    from etforge.core.common.errors import EtforgeError

    out = _copy(m33, tmp_path)
    marker = tmp_path / "EXECUTED"
    evil = io.BytesIO()
    torch.save(_Planted(marker), evil)
    buf = io.BytesIO()
    with zipfile.ZipFile(out / LOWERED) as src, zipfile.ZipFile(buf, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, evil.getvalue() if info.filename == member else src.read(info.filename))
    (out / LOWERED).write_bytes(buf.getvalue())
    _rehash(out, LOWERED)
    with pytest.raises(EtforgeError, match=r"lowered_edge\.exir: refused") as err:
        _verify(out)
    assert not marker.exists(), "a planted pickle ran"
    assert "\n" not in str(err.value)


def test_the_cli_says_which_program_ran(m33: Path, tmp_path: Path) -> None:
    """The step line and --json's lowered_source; --rebuild beside the device runtime is refused."""
    shown = run_cli("verify", str(m33), "--samples", "2", "--min-top1", "0")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "loaded the lowered program the compile saved (lowered_edge.exir" in shown.stdout
    for flags, source in (
        ((), "saved"),
        (("--rebuild",), "lowered again"),
        (("--reconvert",), "lowered again"),
    ):
        proc = run_cli("verify", str(m33), "--samples", "2", "--min-top1", "0", "--json", *flags)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout[proc.stdout.index("{") :])["lowered_source"] == source, flags
    refused = run_cli("verify", str(tmp_path), "--runtime", "qemu-m33", "--rebuild")
    assert (
        refused.returncode == 2
        and "--rebuild goes with the host verification" in refused.stdout + refused.stderr
    )


@pytest.mark.slow
def test_a_delegate_report_json_does_not_record_is_named(tmp_path: Path) -> None:
    """The saved program's delegates are paired with report.json's partitions by the name in
    their compile specs (a recurrent model's graph order differs from the partitions' order):
    a report whose partition is renamed (file, record and hash alike) names the delegate."""
    from etforge.core.common.errors import EtforgeError

    out = _compile(tmp_path / "out", MIXED, "imxrt700cm", "--no-cache")
    report = json.loads((out / "report.json").read_text())
    part = report["partitions"][0]
    digest = report["files_sha256"].pop(part["tflite"])
    (out / part["tflite"]).rename(out / "partitions" / "etforge_9.tflite")
    old, part["name"], part["tflite"] = part["name"], "etforge_9", "partitions/etforge_9.tflite"
    report["files_sha256"][part["tflite"]] = digest
    (out / "report.json").write_text(json.dumps(report))
    with pytest.raises(
        EtforgeError,
        match=rf"lowered_edge\.exir: a delegate for partition '{old}', which report\.json records nowhere",
    ):
        _verify(out)
