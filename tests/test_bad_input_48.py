"""Bad input named in one line (issue 48): a forward returning no tensor, a batch into a
non-UTF-8 directory, a non-UTF-8 or deeply nested manifest, a ``.pt2`` decompression bomb,
unbounded numeric options; and an unseeded factory is told, not silently nondeterministic."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from etforge.core.batch.run import MAX_MANIFEST_NESTING, load_manifest
from etforge.core.common.errors import EtforgeError
from etforge.core.front.load import UNSEEDED_NOTE, load_model, load_program

from support import REPO, run_cli

BAD_FORWARDS = """
import torch

class Returns(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, x):
        return self.value

def none():
    return Returns(None), (torch.ones(1, 4),)

def string():
    return Returns("abc"), (torch.ones(1, 4),)

def unseeded():
    return torch.nn.Linear(4, 2).eval(), (torch.ones(1, 4),)

def seeded():
    torch.manual_seed(3)
    return torch.nn.Linear(4, 2).eval(), (torch.ones(1, 4),)
"""


def _error_line(proc: object) -> str:
    text = (proc.stdout + proc.stderr).strip()  # type: ignore[attr-defined]
    lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert proc.returncode != 0 and len(lines) == 1, text  # type: ignore[attr-defined]
    assert "unexpected" not in lines[0] and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize(("factory", "got"), [("none", "NoneType"), ("string", "str")])
def test_a_forward_returning_no_tensor_is_one_line(tmp_path: Path, factory: str, got: str) -> None:
    (tmp_path / "bad.py").write_text(BAD_FORWARDS)
    proc = run_cli("compile", f"{tmp_path / 'bad.py'}:{factory}", "-o", str(tmp_path / "out"), "--no-cache")
    line = _error_line(proc)
    assert f"bad.py:{factory}" in line and f"forward returns {got}, no tensor" in line
    assert not (tmp_path / "out").exists()


def test_an_unseeded_factory_is_told(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(BAD_FORWARDS)
    unseeded = load_model(f"{tmp_path / 'm.py'}:unseeded")
    told = UNSEEDED_NOTE.format(where=f"{tmp_path / 'm.py'}:unseeded")
    assert told in unseeded.notes
    assert load_model(f"{tmp_path / 'm.py'}:seeded").notes == []


def test_a_batch_into_a_non_utf8_directory(tmp_path: Path) -> None:
    models = REPO / "tests" / "batch_models.py"
    out = os.fsencode(tmp_path) + b"/out\xff"
    argv = [f"{models}:mlp", f"{models}:residual", "--target", "imxrt700", "-o", os.fsdecode(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "etforge", "compile", *argv, "--no-cache", "--jobs", "2"],
        capture_output=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # bytes: the summary names the directory as its bytes are
    text = (proc.stdout + proc.stderr).decode("utf-8", "backslashreplace")
    assert proc.returncode == 0, text
    assert "2 of 2 compiled" in text and "\\xff" in text
    assert os.path.isfile(out + b"/batch_models_mlp/imxrt700/model.pte")


def test_a_manifest_with_a_non_utf8_byte_is_named(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_bytes(b'{"models": ["zoo:cifarnet"],\n "targets": ["imxrt700\xff"]}')
    with pytest.raises(EtforgeError) as err:
        load_manifest(path, tmp_path / "out")
    assert str(err.value) == f"manifest {path}: not UTF-8 text (byte 0xff on line 2)"


@pytest.mark.parametrize(
    ("suffix", "body"),
    [
        (".toml", "models = " + "[" * 100_000 + "]" * 100_000 + "\n"),
        (".toml", "x = " + "{a=" * 5_000 + "1" + "}" * 5_000 + "\n"),
        (".json", '{"models": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ],
)
def test_a_deeply_nested_manifest_is_one_line(tmp_path: Path, suffix: str, body: str) -> None:
    path = tmp_path / f"m{suffix}"
    path.write_text(body)
    with pytest.raises(EtforgeError) as err:
        load_manifest(path, tmp_path / "out")
    assert str(err.value) == f"manifest {path}: nested more than {MAX_MANIFEST_NESTING} levels deep"


def test_a_pt2_bomb_is_refused_before_it_inflates(tmp_path: Path) -> None:
    lin = torch.nn.Linear(4, 2)
    good = tmp_path / "good.pt2"
    torch.export.save(torch.export.export(lin, (torch.ones(1, 4),), strict=False), good)
    assert load_program(good) is not None
    bomb = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        with dst.open("good/data/zeros", "w", force_zip64=True) as f:  # 256 MiB of zeros, deflated
            chunk = bytes(1 << 20)
            for _ in range(256):
                f.write(chunk)
    assert bomb.stat().st_size < 2 * 1024 * 1024
    with pytest.raises(EtforgeError) as err:
        load_program(bomb)
    assert str(err.value).startswith(f"{bomb}: refused: its ") and "inflates to" in str(err.value)
    proc = run_cli("compile", str(bomb), "-o", str(tmp_path / "out"), "--no-cache")
    assert "inflates to" in _error_line(proc)


@pytest.mark.parametrize(
    "args",
    [
        ("--samples", "1e20"),
        ("--samples", "100000000000000000000"),
        ("--seed", "100000000000000000000000"),
        ("--seed", "-1"),
    ],
)
def test_numeric_options_are_bounded(tmp_path: Path, args: tuple[str, str]) -> None:
    proc = run_cli("verify", str(tmp_path), *args)
    line = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(line) == 1 and f"'{args[0]}'" in line[0], proc.stdout + proc.stderr
