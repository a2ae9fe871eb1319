"""Accuracy on real data: the trained digits models keep their accuracy on every target, and bad
data files are refused with one clear line."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from etforge.core.common.errors import EtforgeError

from support import run_cli

TARGETS = ("imxrt700", "imxrt700cm", "cortex-m33")
MODELS = ("digits_cnn", "digits_mlp")
#: The issue's bound: int8 may cost at most one point of top-1 accuracy on the test split.
MAX_DROP = 1.0


@cache
def _compiled(name: str, target: str) -> tuple[Any, dict[str, Any]]:
    from etforge import zoo
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    model, example = zoo.build(name)
    reg = registry()
    result = compile_model(model, example, target, calibration=zoo.calibration(name), reg=reg)
    return result, build_report(result, reg, f"zoo:{name}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", MODELS)
def test_trained_model_keeps_its_accuracy(name: str, target: str) -> None:
    from etforge.runtime.verification.accuracy import load_labeled
    from etforge.runtime.verification.verify import compare

    result, report = _compiled(name, target)
    v = compare(
        result.host_program,
        result.float_program,
        result.quantized_program,
        report,
        samples=4,
        data=load_labeled(f"zoo:{name}", report),
    )
    assert v.data_samples == 360  # every fifth of scikit-learn's 1,797 digits
    assert v.float_accuracy > 90.0  # trained, not random: chance is 10%
    assert v.accuracy_drop <= MAX_DROP, (v.float_accuracy, v.compiled_accuracy)
    assert v.ok, v.failures


def test_training_is_deterministic_and_a_bad_cache_entry_is_retrained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from etforge.zoo import digits

    monkeypatch.setenv("ETFORGE_CACHE_DIR", str(tmp_path))
    digits.trained_state.cache_clear()
    try:
        first = digits.trained_state("digits_mlp")
        (entry,) = (tmp_path / "zoo").glob("digits_mlp-*.pt")
        again = digits.train("digits_mlp")
        assert all(torch.equal(first[k], again[k]) for k in first)
        entry.write_bytes(b"not a state dict")
        digits.trained_state.cache_clear()
        rebuilt = digits.trained_state("digits_mlp")
        assert all(torch.equal(first[k], rebuilt[k]) for k in first)
        assert torch.load(entry, weights_only=True).keys() == first.keys()  # replaced, valid
    finally:
        digits.trained_state.cache_clear()


def _npz(path: Path, **arrays: Any) -> str:
    np.savez(path, **arrays)
    return str(path)


def _report(shape: list[int]) -> dict[str, Any]:
    return {"inputs": [{"shape": shape, "dtype": "float32"}], "options": {}}


def test_data_formats_npz_pt_and_zoo_read_the_same_samples(tmp_path: Path) -> None:
    from etforge.runtime.verification.accuracy import load_labeled
    from etforge.zoo import digits

    x, y = digits.test_data("digits_mlp")
    report = _report([1, 64])
    npz = load_labeled(_npz(tmp_path / "d.npz", x=x.numpy(), y=y.numpy()), report)
    torch.save({"x": x, "y": y}, tmp_path / "d.pt")
    pt = load_labeled(str(tmp_path / "d.pt"), report)
    torch.save((x, y.int()), tmp_path / "pair.pt")
    pair = load_labeled(str(tmp_path / "pair.pt"), report)
    zoo = load_labeled("zoo:digits_mlp", report)
    for d in (npz, pt, pair, zoo):
        assert torch.equal(d.x, x) and torch.equal(d.y, y) and d.y.dtype == torch.int64


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((4, 64), np.float32)}, "no array 'y'"),
        ({"x": np.zeros((4, 8, 8), np.float32), "y": np.zeros(4, np.int64)}, "x has shape [4, 8, 8]; expected [N, 64]"),
        ({"x": np.zeros((4, 64), np.int64), "y": np.zeros(4, np.int64)}, "x has dtype int64; expected floating-point"),
        ({"x": np.zeros((4, 64), np.float32), "y": np.zeros(4, np.float32)}, "y has dtype float32; expected integer"),
        ({"x": np.zeros((4, 64), np.float32), "y": np.zeros(3, np.int64)}, "y has shape [3]; expected [4]"),
        ({"x": np.zeros((4, 64), np.float32), "y": np.array([0, 1, -1, 2])}, "label -1 at sample 2 is negative"),
        ({"x": np.full((2, 64), np.nan, np.float32), "y": np.zeros(2, np.int64)}, "NaN or infinity (sample 0)"),
    ],
)  # fmt: skip
def test_bad_data_file_is_one_clear_line(tmp_path: Path, arrays: dict[str, Any], message: str) -> None:
    from etforge.runtime.verification.accuracy import load_labeled

    path = _npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(EtforgeError) as err:
        load_labeled(path, _report([1, 64]))
    assert message in str(err.value) and path in str(err.value) and "\n" not in str(err.value)


def test_unreadable_data_files_are_named(tmp_path: Path) -> None:
    from etforge.runtime.verification.accuracy import load_labeled

    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    (tmp_path / "junk.pt").write_bytes(b"not a pickle")
    (tmp_path / "data.csv").write_text("1,2\n")
    torch.save({"inputs": torch.zeros(2, 64)}, tmp_path / "keys.pt")
    cases = {
        str(tmp_path / "junk.npz"): "not a readable .npz archive",
        str(tmp_path / "junk.pt"): "not a tensors-only torch.save file",
        str(tmp_path / "data.csv"): "expected a .npz or .pt file",
        str(tmp_path / "keys.pt"): "no tensor 'x' or 'y' (holds 'inputs')",
        str(tmp_path / "missing.npz"): "no such file",
        "zoo:cifarnet": "no held-out data for that zoo model",
    }
    for spec, message in cases.items():
        with pytest.raises(EtforgeError) as err:
            load_labeled(spec, _report([1, 64]))
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_label_out_of_range_for_the_model_is_named() -> None:
    from etforge.runtime.verification.accuracy import Labeled, evaluate

    result, report = _compiled("digits_mlp", "imxrt700")
    x = torch.zeros(3, 64)
    with pytest.raises(
        EtforgeError, match=r"label 10 at sample 1 is out of range for the model's 10 outputs"
    ):
        evaluate(
            result.host_program, result.float_program, Labeled(x, torch.tensor([3, 10, 2]), "d.npz"), report
        )


def _in_process(*args: str) -> Any:
    """The CLI in this process (it has paid for importing torch); -v leaves its logging alone."""
    from click.testing import CliRunner

    from etforge.cli import main

    return CliRunner().invoke(main, ["-v", *args])


def test_cli_zoo_data_then_verify_with_data(tmp_path: Path) -> None:
    data = tmp_path / "digits.npz"
    result = _in_process("zoo-data", "digits_mlp", str(data))
    assert result.exit_code == 0, result.output
    with np.load(data) as archive:
        assert archive["x"].shape == (360, 64) and archive["y"].dtype == np.int64
    out = tmp_path / "out"
    result = _in_process("compile", "zoo:digits_mlp", "--target", "imxrt700", "-o", str(out))
    assert result.exit_code == 0, result.output
    # verify in a fresh process: it rebuilds everything from OUT and the data file alone
    proc = run_cli("verify", str(out), "--samples", "4", "--data", str(data), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    v = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert v["ok"] and v["data_samples"] == 360 and v["max_accuracy_drop"] == 1.0
    assert v["float_accuracy"] - v["compiled_accuracy"] == pytest.approx(v["accuracy_drop"])
    assert all("off_by_one" in o for o in v["ops"]) and "skipped_values" in v
    # labels the model cannot output: one line, exit 1
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((2, 64), np.float32), y=np.array([0, 12]))
    result = _in_process("verify", str(out), "--samples", "4", "--data", str(bad))
    assert result.exit_code == 1, result.output
    assert "label 12 at sample 1 is out of range for the model's 10 outputs" in result.stderr
    assert "Traceback" not in result.stderr
