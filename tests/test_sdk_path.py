"""The eIQ Neutron SDK path, run end to end against a test double of the SDK (tests/sdk_double).

The double converts like the SDK (one NeutronGraph node with microcode, weights and kernels
tensors), raises, aborts or hangs. What etforge packs from its output must be byte for byte
what ExecuTorch's own NXP backend (``PayloadComposer``) packs from the same converted model,
run in a child that imports upstream's backend with the double installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from shared_outputs import compile_once

from etforge.plugins.targets.eiq_neutron_sdk import pack_neutron_payload

from support import REPO

DOUBLE = REPO / "tests" / "sdk_double"
MODEL = f"{REPO / 'tests' / 'models' / 'user_models.py'}:small"
MODE_ENV = "ETFORGE_SDK_DOUBLE"
PIDFILE_ENV = "ETFORGE_SDK_DOUBLE_PIDFILE"
#: The double's error message in mode "raise" (tests/sdk_double/eiq_neutron_sdk/__init__.py).
SDK_ERROR = "NeutronConverter: cannot legalize graph"


def _with_double(env: dict[str, str], mode: str) -> dict[str, str]:
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(DOUBLE), env.get("PYTHONPATH", "")) if p)
    env[MODE_ENV] = mode
    env["COLUMNS"] = "200"
    return env


def _cli(*args: str, mode: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = _with_double({**os.environ, **(extra_env or {})}, mode)
    return subprocess.run(
        [sys.executable, "-m", "etforge", *args], capture_output=True, text=True, env=env, timeout=600
    )


def _upstream(jobs: list[dict[str, str]], tmp: Path) -> None:
    """Convert with the double and pack with ExecuTorch's PayloadComposer, in a child."""
    spec = tmp / "jobs.json"
    spec.write_text(json.dumps(jobs))
    proc = subprocess.run(
        [sys.executable, str(DOUBLE / "upstream_payload.py"), str(spec)],
        capture_output=True,
        text=True,
        env=_with_double(dict(os.environ), "v1"),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _multi_io_tflite() -> bytes:
    """A 2-input, 3-output int8 LiteRT model (ADD, SUB, MUL), for non-trivial I/O index maps."""
    model = schema.ModelT()
    model.version = 3
    model.buffers = [schema.BufferT()]
    model.operatorCodes = []
    for op in (schema.BuiltinOperator.ADD, schema.BuiltinOperator.SUB, schema.BuiltinOperator.MUL):
        code = schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = op
        code.version = 1
        model.operatorCodes.append(code)
    graph = schema.SubGraphT()
    graph.tensors = []
    for name in ("a", "b", "sum", "diff", "prod"):
        t = schema.TensorT()
        t.name, t.type, t.shape, t.buffer = name.encode(), schema.TensorType.INT8, [1, 4], 0
        q = schema.QuantizationParametersT()
        q.scale, q.zeroPoint = [0.05], [3]
        t.quantization = q
        graph.tensors.append(t)
    graph.operators = []
    for i, out in enumerate((2, 3, 4)):
        op = schema.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = i, [0, 1], [out]
        graph.operators.append(op)
    graph.inputs, graph.outputs = [0, 1], [2, 3, 4]
    model.subgraphs = [graph]
    builder = flatbuffers.Builder(256)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


@pytest.fixture(scope="module")
def sdk_compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdk") / "out"
    # _cli's command and environment (one compile per session: tests/shared_outputs.py)
    proc = compile_once(MODEL, "--target", "imxrt700", out=out, pythonpath=DOUBLE, env={MODE_ENV: "v1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def upstream(
    sdk_compiled: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], tuple[bytes, bytes]]:
    """(source, mode) -> (the double's converted model, upstream's payload), from one child."""
    tmp = tmp_path_factory.mktemp("upstream")
    (tmp / "multi.tflite").write_bytes(_multi_io_tflite())
    name = json.loads((sdk_compiled / "report.json").read_text())["partitions"][0]["name"]
    sources = {"partition": sdk_compiled / "partitions" / f"{name}.tflite", "multi": tmp / "multi.tflite"}
    keys = [(k, mode) for k in sources for mode in ("v0", "v1")]
    _upstream(
        [
            {
                "tflite": str(sources[k]),
                "mode": m,
                "converted": str(tmp / f"{k}.{m}.c"),
                "payload": str(tmp / f"{k}.{m}.p"),
            }
            for k, m in keys
        ],
        tmp,
    )
    return {(k, m): ((tmp / f"{k}.{m}.c").read_bytes(), (tmp / f"{k}.{m}.p").read_bytes()) for k, m in keys}


def _delegates(pte: Path) -> list[tuple[str, bytes]]:
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DataLocation

    program = deserialize_pte_binary(pte.read_bytes()).program
    out = []
    for plan in program.execution_plan:
        for d in plan.delegates:
            assert d.processed.location == DataLocation.INLINE
            out.append((d.id, bytes(program.backend_delegate_data[d.processed.index].data)))
    return out


def test_pte_carries_upstreams_payload_for_neutron_backend(
    sdk_compiled: Path, upstream: dict[tuple[str, str], tuple[bytes, bytes]]
) -> None:
    report = json.loads((sdk_compiled / "report.json").read_text())
    assert not report["host_only"] and report["npu_compiler"]["available"]
    assert len(report["partitions"]) == 1
    [(backend_id, data)] = _delegates(sdk_compiled / "model.pte")
    assert backend_id == "NeutronBackend"
    assert data == upstream[("partition", "v1")][1]  # the compile ran the double in mode v1
    assert b"NEUTRON-DOUBLE microcode" in data  # the SDK's bytes, not anything etforge made


def test_sdk_kernel_selection_is_merged_into_codegen(sdk_compiled: Path) -> None:
    name = json.loads((sdk_compiled / "report.json").read_text())["partitions"][0]["name"]
    written = (sdk_compiled / "partitions" / f"{name}_kernel_selection.c").read_text()
    assert "eIQ Neutron SDK test double" in written  # what the SDK dumped in its working directory
    merged = (sdk_compiled / "codegen" / "etforge_model_neutron_kernels.c").read_text()
    assert f"partition {name}" in merged and written in merged
    header = (sdk_compiled / "codegen" / "etforge_model.h").read_text()
    assert "kHasNeutronKernelSelection = true" in header and "kAllDelegatesOnDevice = true" in header
    assert "etforge_model_neutron_kernels.c" in (sdk_compiled / "codegen" / "etforge_model.cmake").read_text()


@pytest.mark.parametrize("mode", ["v0", "v1"])
def test_payload_version_and_io_maps_match_upstream(
    mode: str, upstream: dict[tuple[str, str], tuple[bytes, bytes]]
) -> None:
    """Both NeutronGraph output layouts, on a real partition and on a 2-in/3-out model."""
    for source in ("partition", "multi"):
        converted, payload = upstream[(source, mode)]
        assert pack_neutron_payload(converted) == payload, source
    # what the header says, read independently of both packers: the double lists the
    # multi-I/O model's tensors reversed, and only v1 has the profile and debug outputs
    header = upstream[("multi", mode)][1]
    assert list(header[:3]) == [2, 3, 2]
    assert list(header[3 + 5 : 3 + 5 + 5]) == [1, 0, 2, 1, 0]
    assert header[3 + 5 + 5] == (1 if mode == "v1" else 0)


def _sdk_output(n_ops: int, custom: bytes) -> bytes:
    model = schema.ModelT()
    model.version, model.buffers = 3, [schema.BufferT()]
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = custom
    model.operatorCodes = [code]
    graph = schema.SubGraphT()
    graph.tensors = []
    for name in ("x", "y", "mc", "w", "k", "scratch"):
        t = schema.TensorT()
        t.name, t.type, t.shape, t.buffer = name.encode(), schema.TensorType.UINT8, [4], 0
        graph.tensors.append(t)
    buf = schema.BufferT()
    buf.data = np.arange(4, dtype=np.uint8)
    model.buffers.append(buf)
    for t in (2, 3, 4):
        graph.tensors[t].buffer = 1
    graph.operators = []
    for _ in range(n_ops):
        op = schema.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = 0, [0, 2, 3, 4], [1, 5]
        graph.operators.append(op)
    graph.inputs, graph.outputs = [0], [1]
    model.subgraphs = [graph]
    builder = flatbuffers.Builder(256)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def test_malformed_sdk_output_is_refused() -> None:
    assert len(pack_neutron_payload(_sdk_output(1, b"NeutronGraph"))) == 16 * 4
    with pytest.raises(ValueError, match="2 operators"):
        pack_neutron_payload(_sdk_output(2, b"NeutronGraph"))
    with pytest.raises(ValueError, match="not the NeutronGraph custom op"):
        pack_neutron_payload(_sdk_output(1, b"SomethingElse"))
    with pytest.raises(ValueError, match="not a TFLite flatbuffer"):
        pack_neutron_payload(_sdk_output(1, b"NeutronGraph")[:40])  # truncated


@pytest.mark.parametrize("mode", ["raise", "abort", "hang"])
def test_sdk_failure_fails_compile_and_writes_nothing(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``etforge compile`` in this process; the double, like the SDK, runs in its child process."""
    from click.testing import CliRunner

    from etforge.cli import main
    from etforge.core.contracts import target as target_mod

    out = tmp_path / "out"
    pidfile = tmp_path / "sdk.pid"
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), PIDFILE_ENV: str(pidfile)}
    for key, value in _with_double(env, mode).items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(DOUBLE))  # find_spec sees the SDK; the child imports it
    monkeypatch.setattr(target_mod, "_PROBED", {})  # the double's figures stay in this test
    args = ["compile", MODEL, "--target", "imxrt700", "-o", str(out)]
    timeout = 15
    if mode == "hang":
        args += ["--option", f"npu_timeout={timeout}"]
    start = time.monotonic()
    result = CliRunner().invoke(main, ["-v", *args])  # -v: leave this process's logging alone
    elapsed = time.monotonic() - start
    err = " ".join(result.stderr.split())  # the console wraps long lines
    assert result.exit_code == 1, result.output
    assert "eIQ Neutron SDK on partition etforge_0" in err and "Traceback" not in result.stderr
    if mode == "raise":
        assert f"RuntimeError: {SDK_ERROR}" in err
    elif mode == "abort":
        assert "crashed (signal 6) [SIGABRT]" in err
    else:
        assert f"did not finish within {timeout} s" in err and "npu_timeout" in err
        pid = int(pidfile.read_text())  # the double reached the SDK call and hung there ...
        with pytest.raises(ProcessLookupError):  # ... and the timeout killed it
            os.kill(pid, 0)
        assert elapsed < 600
    # no model.pte, no half-written output directory, no staging leftovers beside it
    assert not out.exists() or not any(out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir() if p not in (out, pidfile)) == []


def test_verify_runs_the_litert_source_of_device_partitions_and_says_so(sdk_compiled: Path) -> None:
    proc = _cli("verify", str(sdk_compiled), "--samples", "4", mode="v1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "device microcode, which runs on the NPU only" in proc.stdout
    assert "4/4 samples identical" in proc.stdout  # model.pte itself, its delegates stood in for
