"""The chip comes from the target: a data-only target for another Neutron chip (the one
docs/writing-a-target-plugin.md shows) reaches the SDK (its test double) under its own name,
with the compiler options upstream always passes, and its payload marks channels-last I/O as
upstream's ``PayloadComposer`` does; a chip upstream's target spec refuses (hardware version,
Neutron-S) is refused naming the target; a misspelt ``requires`` flag fails the plugin."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO, run_cli, write_distribution

DOUBLE = REPO / "tests" / "sdk_double"
DOC = REPO / "docs" / "writing-a-target-plugin.md"
MODEL = f"{REPO / 'tests' / 'models' / 'user_models.py'}:small"


def _doc_plugin(device: str) -> str:
    """The doc's whole plugin module, for the chip ``device`` (a name the double knows)."""
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)
    (module,) = [b for b in blocks if "def etforge_targets" in b]
    assert 'device="my-chip"' in module
    return module.replace('device="my-chip"', f'device="{device}"')


def _env(plugin_dir: Path) -> dict[str, str]:
    path = os.pathsep.join([str(plugin_dir), str(DOUBLE), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "ETFORGE_SDK_DOUBLE": "v1"}


def _install(tmp: Path, device: str) -> Path:
    root = tmp / f"plugin-{device}"
    write_distribution(
        root, "my-chip-target", "1.0", {"my_chip": "my_chip_target"}, {"my_chip_target": _doc_plugin(device)}
    )
    return root


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("chip")
    out = tmp / "out"
    proc = run_cli(
        "compile", MODEL, "--target", "my-chip", "-o", str(out), env=_env(_install(tmp, "double-n3"))
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out


def _delegates(pte: Path) -> list[bytes]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte.read_bytes()).program
    return [
        bytes(program.backend_delegate_data[d.processed.index].data)
        for plan in program.execution_plan
        for d in plan.delegates
    ]


def test_partitions_are_compiled_for_the_targets_chip(compiled: Path) -> None:
    report = json.loads((compiled / "report.json").read_text())
    assert not report["host_only"] and report["partitions"]
    payloads = _delegates(compiled / "model.pte")
    assert payloads and all(b"microcode for double-n3 (" in p for p in payloads)
    assert all(b"imxrt700" not in p for p in payloads)
    # the option upstream's NeutronConverterManager always passes reached the SDK
    assert all(b"excludeGraphPasses='HoistSliceAboveTranspose,MergeTranspose'" in p for p in payloads)


@pytest.mark.slow  # outside the fast tier: upstream's payload in a child (issue 47)
def test_channels_last_io_flags_match_upstreams_payload(compiled: Path, tmp_path: Path) -> None:
    """On a Cortex-M fallback every 4-D tensor is channels-last (docs/targets.md): upstream's
    PayloadComposer, told the partition's 4-D graph I/O are CHANNELS_LAST, packs the bytes
    etforge put in the .pte -- flag bytes included."""
    from ai_edge_litert import schema_py_generated as schema

    report = json.loads((compiled / "report.json").read_text())
    (name,) = [p["name"] for p in report["partitions"]]
    tflite = compiled / "partitions" / f"{name}.tflite"
    graph = schema.ModelT.InitFromPackedBuf(tflite.read_bytes(), 0).subgraphs[0]
    io = [*graph.inputs, *graph.outputs]
    four_d = [graph.tensors[t].name.decode() for t in io if len(graph.tensors[t].shape) == 4]
    assert four_d and len(four_d) < len(io), "want a channels-last and a flat tensor at the boundary"
    job = {
        "tflite": str(tflite),
        "mode": "v1",
        "target": "double-n3",
        "channels_last": four_d,
        "converted": str(tmp_path / "c"),
        "payload": str(tmp_path / "p"),
    }
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    env = {**os.environ, **_env(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(DOUBLE / "upstream_payload.py"), str(tmp_path / "jobs.json")],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    upstream = (tmp_path / "p").read_bytes()
    (ours,) = _delegates(compiled / "model.pte")
    n_in, n_out = upstream[0], upstream[1]
    assert 1 in upstream[3 : 3 + n_in + n_out] and 0 in upstream[3 : 3 + n_in + n_out]
    assert ours == upstream


@pytest.mark.parametrize(
    ("device", "why"),
    [
        ("double-n1", "reports hardware version 1 for double-n1"),
        ("double-s", "reports double-s as a Neutron-S subsystem"),
    ],
)
def test_chips_upstream_refuses_are_refused_naming_the_target(device: str, why: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli(
        "compile", MODEL, "--target", "my-chip", "-o", str(out), env=_env(_install(tmp_path, device))
    )
    assert proc.returncode != 0
    assert "target 'my-chip'" in proc.stderr and why in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (out / "model.pte").exists()


def test_misspelt_requires_flag_fails_the_plugin(tmp_path: Path) -> None:
    module = _doc_plugin("double-n3").replace(
        "limits={", 'requires=(*NEUTRON_C.requires, "slice_unit_stepp"),\n    limits={'
    )
    root = tmp_path / "typo"
    write_distribution(root, "typo-target", "2.0", {"typo": "typo_target"}, {"typo_target": module})
    proc = run_cli("--strict", "plugins", pythonpath=root)
    assert proc.returncode == 1
    assert "typo-target 2.0" in proc.stderr and "'slice_unit_stepp' is not declared" in proc.stderr
    assert "did you mean 'slice_unit_step'?" in proc.stderr
