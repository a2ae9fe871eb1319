"""``etforge codegen`` reads a program without torch (issue 47): ExecuTorch's generated
flatbuffer accessors alone (``core/serialize/pte_read.py``) and torch's operator schemas from
the table a first run stores (``codegen/torch_schemas.py``). Checked by what a fresh
interpreter imported, not by a wall-clock limit; the files are byte-identical to a run that
imported torch, and the reader agrees with ExecuTorch's own deserializer."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Compiles and three fresh interpreters: outside the fast tier (imports below, in the fixture).
pytestmark = pytest.mark.slow

CASES = [("ds_cnn", "imxrt700"), ("ds_cnn", "cortex-m33")]

CODE = r"""
import json, sys


def check(view, ref):
    assert len(view.execution_plan) == len(ref.execution_plan)
    for a, b in zip(view.execution_plan, ref.execution_plan):
        assert a.name == b.name and a.inputs == list(b.inputs) and a.outputs == list(b.outputs)
        assert a.non_const_buffer_sizes == list(b.non_const_buffer_sizes)
        assert [(o.name, o.overload) for o in a.operators] == [(o.name, o.overload) for o in b.operators]
        assert [(d.id, d.processed.location, d.processed.index) for d in a.delegates] == [
            (d.id, int(d.processed.location), d.processed.index) for d in b.delegates
        ]
        assert [[(c.key, c.value) for c in d.compile_specs] for d in a.delegates] == [
            [(c.key, bytes(c.value)) for c in d.compile_specs] for d in b.delegates
        ]
        assert len(a.values) == len(b.values)
        for va, vb in zip(a.values, b.values):
            kind = type(vb.val).__name__
            if kind == "Tensor":
                t, u = va.val, vb.val
                assert (t.scalar_type, t.sizes, t.dim_order) == (int(u.scalar_type), list(u.sizes), list(u.dim_order))
                assert (t.allocation_info is None) == (u.allocation_info is None)
            elif kind in ("Int", "Double", "Bool"):
                assert va.val == type(va.val)(*vars(vb.val).values()), (va, vb)
            else:
                assert type(va.val).__name__ == "Other"
        calls = [i.instr_args for c in b.chains for i in c.instructions]
        mine = [i.instr_args for c in a.chains for i in c.instructions]
        assert len(calls) == len(mine)
        for x, y in zip(mine, calls):
            assert getattr(x, "args", None) == getattr(y, "args", None)
            assert getattr(x, "op_index", None) == getattr(y, "op_index", None)
    assert [d.data for d in view.backend_delegate_data] == [bytes(d.data) for d in ref.backend_delegate_data]


from click.testing import CliRunner
from etforge.cli import main

jobs = json.loads(sys.argv[1])
results = []
for pte, out in jobs:
    r = CliRunner().invoke(main, ["codegen", pte, "-o", out, "--c-api", "net"])
    results.append([r.exit_code, r.output[-2000:]])
heavy = sorted(m for m in ("torch", "executorch.exir", "torchao") if m in sys.modules)
if sys.argv[2] == "compare":  # then the reader against ExecuTorch's own deserializer
    from pathlib import Path
    from etforge.core.serialize import pte_read
    views = {pte: pte_read.read(Path(pte).read_bytes()) for pte, _ in jobs}
    from executorch.exir._serialize._program import deserialize_pte_binary  # the real package
    for pte, _ in jobs:
        check(views[pte], deserialize_pte_binary(Path(pte).read_bytes()).program)
print(json.dumps({"results": results, "heavy": heavy}))
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    from etforge import zoo
    from etforge.core.build import output
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    reg = registry()
    out = {}
    for name, target in CASES:
        model, example = zoo.build(name)
        result = compile_model(model, example, target, calibration=zoo.calibration(name, 4), reg=reg)
        d = tmp_path_factory.mktemp(f"{name}-{target}")
        output.write_outputs(d, result, build_report(result, reg, f"zoo:{name}"))
        out[(name, target)] = d / output.PTE
    return out


def _codegen(jobs: list[tuple[Path, Path]], cache: Path, then: str = "") -> dict:
    env = {**os.environ, "ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(cache)}
    arg = json.dumps([[str(a), str(b)] for a, b in jobs])
    proc = subprocess.run(
        [sys.executable, "-c", CODE, arg, then], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(code == 0 for code, _ in got["results"]), got["results"]
    return got


def _said(run: dict, out: Path) -> list[str]:
    """What each codegen printed, its output directory taken out: the console wraps long lines
    at its width, so a path one character longer breaks them elsewhere (whitespace dropped)."""
    return ["".join(said.split()).replace(str(out), "") for _, said in run["results"]]


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_codegen_imports_no_torch_once_the_schemas_are_stored(
    programs: dict[tuple[str, str], Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = _codegen([(pte, tmp_path / "first" / f"{m}-{t}") for (m, t), pte in programs.items()], cache)
    assert "torch" in first["heavy"], first  # an empty cache: torch is asked once, the table stored
    assert list(cache.glob("torch-schemas/*.json")), "no table stored"
    # a fresh interpreter with the table: no torch, no executorch.exir, the same bytes; then
    # (after that is recorded) its reader checked against ExecuTorch's deserializer
    second = _codegen(
        [(pte, tmp_path / "second" / f"{m}-{t}") for (m, t), pte in programs.items()], cache, "compare"
    )
    assert second["heavy"] == [], second["heavy"]
    assert _digests(tmp_path / "second") == _digests(tmp_path / "first")
    assert _said(second, tmp_path / "second") == _said(first, tmp_path / "first")


def test_a_damaged_or_foreign_table_is_recomputed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from etforge.codegen import kernels, torch_schemas
    from etforge.core.registry.manager import registry

    monkeypatch.setenv("ETFORGE_NO_CACHE", "0")
    monkeypatch.setenv("ETFORGE_CACHE_DIR", str(tmp_path))
    libraries = json.dumps(kernels._parsed(registry()), sort_keys=True, default=str)
    torch_schemas.table.cache_clear()
    good = torch_schemas.table(libraries)
    (path,) = (tmp_path / torch_schemas.SUBDIR).glob("*.json")
    assert json.loads(path.read_text()) == good and good["schemas"]["aten::add.out"].startswith(
        "aten::add.out("
    )
    for damage in (json.dumps({"key": good["key"], "schemas": {}, "tags": {}}), "{not json", ""):
        path.write_text(damage)
        torch_schemas.table.cache_clear()
        assert torch_schemas.table(libraries) == good
        assert json.loads(path.read_text()) == good
    torch_schemas.table.cache_clear()
