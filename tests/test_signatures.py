"""Odd model signatures compile and verify on every target, or are refused at compile time.

A model may return a dict, nested tuples/lists/dicts, ``None`` or Python numbers beside its
tensors, an integer tensor (an argmax); it may take integer token ids (an ``Embedding``
front) or inputs of several dtypes. The ``.pte``'s outputs are the pytree leaves of what
``forward`` returns; each is compared with its own reference (``runtime/verification/outputs.py``), and
``model.pte`` itself, run by the host interpreter, must return the same leaves. A zero-size
example input is refused with one line naming it, and nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import etforge
from etforge.core.common.errors import EtforgeError
from etforge.runtime.execution.pte_interpreter import PteInterpreter
from etforge.runtime.verification.inputs import seeded_inputs
from etforge.runtime.verification.outputs import OutputCheck
from etforge.runtime.verification.pte_agreement import compare_with_edge
from etforge.runtime.verification.verify import compare, top1_required, verify

from support import run_cli

TARGETS = ("imxrt700", "imxrt700cm", "cortex-m33")
#: Seeded verify samples per case (the gates scale with it: all but 1 in 32 must agree).
SAMPLES = 8
VOCAB = 50


class _Features(nn.Module):
    """conv -> ReLU -> pooled linear head: the shared body of the output-signature cases."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def body(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = F.relu(self.conv(x))
        pooled = y.mean((2, 3))
        return y, pooled, self.fc(pooled)


class DictOut(_Features):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        _, pooled, logits = self.body(x)
        return {"logits": logits, "pooled": pooled}


class NestedOut(_Features):
    """A tuple holding a list holding a dict, ``None`` and Python numbers."""

    def forward(self, x: torch.Tensor) -> Any:
        y, pooled, logits = self.body(x)
        return logits, [y, {"p": pooled}], None, 3, 0.5


class IntOut(_Features):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, _, logits = self.body(x)
        return logits, logits.argmax(1)


class Embed(nn.Module):
    """int64 token ids -> Embedding -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.fc = nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(ids)).flatten(1)


class FloatInt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(x + self.emb(ids).sum(1))


class FloatBool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.where(mask, x, torch.zeros_like(x)))


def _batches(*specs: tuple[tuple[int, ...], torch.dtype]) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(8):
        batch: list[torch.Tensor] = []
        for shape, dtype in specs:
            if dtype is torch.float32:
                batch.append(torch.randn(shape, generator=g))
            elif dtype is torch.bool:
                batch.append(torch.randint(0, 2, shape, generator=g).bool())
            else:
                batch.append(torch.randint(0, VOCAB, shape, generator=g, dtype=dtype))
        out.append(tuple(batch))
    return out


IMAGE = ((1, 3, 8, 8), torch.float32)
#: case -> (model class, input specs, the output leaves' names and kinds, by hand from forward)
CASES: dict[str, tuple[type[nn.Module], tuple[Any, ...], list[tuple[str, str]]]] = {
    "dict": (DictOut, (IMAGE,), [("output['logits']", "float"), ("output['pooled']", "float")]),
    "nested_none_constants": (
        NestedOut,
        (IMAGE,),
        [
            ("output[0]", "float"),
            ("output[1][0]", "float"),
            ("output[1][1]['p']", "float"),
            ("output[2]", "constant"),
            ("output[3]", "constant"),
            ("output[4]", "constant"),
        ],
    ),
    "int_output": (IntOut, (IMAGE,), [("output[0]", "float"), ("output[1]", "integer")]),
    "embedding": (Embed, (((1, 6), torch.int64),), [("output", "float")]),
    "float_int": (FloatInt, (((1, 8), torch.float32), ((1, 5), torch.int64)), [("output", "float")]),
    "float_bool": (FloatBool, (((1, 8), torch.float32), ((1, 8), torch.bool)), [("output", "float")]),
}
PARAMS = [(c, t) for c in CASES for t in TARGETS]


def _build(case: str) -> tuple[nn.Module, list[tuple[torch.Tensor, ...]]]:
    cls, specs, _ = CASES[case]
    torch.manual_seed(0)
    return cls().eval(), _batches(*specs)


@pytest.fixture(scope="module")
def compiled() -> dict[tuple[str, str], tuple[Any, list[tuple[torch.Tensor, ...]]]]:
    """Each case on each target, compiled once for the whole module."""
    out = {}
    for case, target in PARAMS:
        model, calib = _build(case)
        out[(case, target)] = (etforge.compile(model, calib[0], target, calibration=calib), calib)
    return out


@pytest.mark.parametrize("case,target", PARAMS, ids=[f"{c}-{t}" for c, t in PARAMS])
def test_compiles_and_verifies_every_output_leaf(
    compiled: dict[tuple[str, str], Any], case: str, target: str
) -> None:
    c, _ = compiled[(case, target)]
    expected = CASES[case][2]
    assert [o["name"] for o in c.report["outputs"]] == [n for n, _ in expected]
    r = c.result
    edge_outputs: list[list[Any]] = []
    v = compare(r.host_program, r.float_program, r.quantized_program, c.report,
                samples=SAMPLES, edge_outputs=edge_outputs)  # fmt: skip
    assert v.ok, v.failures
    assert [(o["name"], o["kind"]) for o in v.outputs] == expected
    need = top1_required(SAMPLES)
    for o in v.outputs:
        assert o["samples"] == SAMPLES and o["agreed"] >= need, o
    # model.pte itself returns the same leaves: None and the constants included
    batches = seeded_inputs(c.report, 0, SAMPLES)
    agreement = compare_with_edge(PteInterpreter(c.pte), r.host_program, batches, "default", edge_outputs)
    assert agreement.ok, agreement.first_difference


def test_the_pte_returns_none_and_constants_in_their_places(compiled: dict[Any, Any]) -> None:
    c, _ = compiled[("nested_none_constants", "cortex-m33")]
    outs = PteInterpreter(c.pte).run(seeded_inputs(c.report, 0, 1)[0])
    assert all(isinstance(o, torch.Tensor) for o in outs[:3])
    assert list(outs[1].shape) == [1, 8, 8, 8] and list(outs[2].shape) == [1, 8]
    assert outs[3:] == [None, 3, 0.5]


@pytest.mark.parametrize("case", ["embedding", "float_int"])
def test_integer_inputs_are_drawn_within_the_range_the_data_spans(
    compiled: dict[Any, Any], case: str
) -> None:
    c, calib = compiled[(case, "imxrt700")]
    j = len(calib[0]) - 1  # the ids are the last input
    ids = torch.stack([b[j] for b in calib])
    assert c.report["inputs"][j]["range"] == [int(ids.min()), int(ids.max())]
    drawn = torch.stack([b[j] for b in seeded_inputs(c.report, 0, 64)])
    assert int(drawn.min()) >= int(ids.min()) and int(drawn.max()) <= int(ids.max())
    assert drawn.dtype == torch.int64 and len(drawn.unique()) > 1


def _leaf_failures(c: Any, change: Any) -> list[str]:
    """OutputCheck's failures when ``change`` alters the program's output leaves."""
    from etforge.runtime.execution.host import run_program
    from etforge.runtime.verification.outputs import exact_leaves

    r = c.result
    check = OutputCheck(r.host_program)
    q_fn = r.quantized_program.module()
    for batch in seeded_inputs(c.report, 0, 4):
        ours = change(list(run_program(r.host_program, batch)))
        check.add(ours, exact_leaves(r.host_program, q_fn, batch))
    return check.failures(top1_required(4), "the reference", None, skip=check.primary)


def test_a_wrong_integer_output_is_named(compiled: dict[Any, Any]) -> None:
    c, _ = compiled[("int_output", "imxrt700")]
    assert _leaf_failures(c, lambda o: o) == []

    def shift(o: list[Any]) -> list[Any]:
        return [o[0], (o[1] + 1) % 4]

    failures = _leaf_failures(c, shift)
    assert len(failures) == 1 and failures[0].startswith("output[1]: equal (integer output)")


def test_a_wrong_constant_or_secondary_output_is_named(compiled: dict[Any, Any]) -> None:
    c, _ = compiled[("nested_none_constants", "imxrt700")]

    def wrong(o: list[Any]) -> list[Any]:
        pooled = o[2].clone()
        pooled[0, pooled.argmin()] = pooled.max() + 1  # another top class
        return [o[0], o[1], pooled, o[3], 4, o[5]]

    failures = _leaf_failures(c, wrong)
    assert [f.split(":")[0] for f in failures] == ["output[1][1]['p']", "output[3]"]


def test_verify_of_saved_outputs_handles_nested_outputs(compiled: dict[Any, Any], tmp_path: Path) -> None:
    """The command's path: rebuild from the saved programs, model.pte in the interpreter."""
    c, _ = compiled[("nested_none_constants", "imxrt700")]
    out = c.save(tmp_path / "out")
    v = verify(out, samples=4)
    assert v.ok, v.failures
    assert v.pte is not None and v.pte.ok and len(v.outputs) == 6


class _Linear3(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_a_zero_size_input_is_refused_naming_it() -> None:
    with pytest.raises(EtforgeError, match=r"input 0 has zero elements \(shape \[0, 3\]\)"):
        etforge.compile(_Linear3().eval(), (torch.zeros(0, 3),), "imxrt700")


def test_the_command_refuses_a_zero_size_input_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x, y):\n"
        "        return x * 2, y * 2\n"
        "def model():\n"
        "    return M(), (torch.randn(2, 3), torch.zeros(1, 0))\n"
    )
    out = tmp_path / "out"
    proc = run_cli("compile", f"{tmp_path / 'm.py'}:model", "--target", "cortex-m33", "-o", str(out))
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "input 1 has zero elements (shape [1, 0])" in errors[0], proc.stderr
    assert not out.exists()
