"""``etforge verify PTE --model MODEL``: verify a ``.pte`` that a user's own script produced.

``verify`` judges a program against references it can rebuild: the float model, the PT2E
quantized program and the lowered Edge program. A script's ``.pte`` comes with none of
them, so they are rebuilt from what the user hands over:

* ``--model`` (the factory the script built its model with): the float program, and
  etforge's own quantization of it (its calibration, or ``--calib``);
* ``--quantized Q.pt2`` (the script's ``torch.export.save``-d quantized program): that
  program is lowered instead, so the reference is exactly what the script quantized.

Everything else is the usual ``verify``: the script's ``.pte`` runs in the host
interpreter and must compute, on every sample, exactly what the rebuilt Edge program
computes; the per-op, top-1 and accuracy gates apply to that program. Whether the ``.pte``
is byte for byte etforge's compile of the same program is reported as a note.

The reference is lowered the way a script's ``to_edge_transform_and_lower`` lowers (the
classic path, ``etforge.compile(..., lowering="classic")``), so the delegate payloads of a
faithful script's ``.pte`` are byte for byte the rebuilt ones.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from etforge.core.common.errors import EtforgeError
from etforge.runtime.verification.deferred_imports import load_program


def verify_script_pte(
    pte: Path,
    model: str,
    target: str,
    options: dict[str, Any] | None = None,
    calib: str | None = None,
    quantized: str | None = None,
    **verify_args: Any,
) -> Any:
    """A :class:`~etforge.runtime.verification.verify.Verification` of ``pte`` against ``model`` on ``target``."""
    from etforge.core.build import output
    from etforge.core.build.report import build_report
    from etforge.core.front.load import check_program_file, load_calibration, load_model
    from etforge.core.registry.manager import registry
    from etforge.core.registry.options import resolve_options
    from etforge.core.serialize.pte_check import check_pte
    from etforge.runtime.verification.verify import verify

    data = check_pte(pte)  # empty, truncated, not a program: refused before any work
    reg = registry()
    spec = reg.target(target)
    opts = resolve_options(spec, options or {})
    loaded = load_model(model)
    calibration = load_calibration(calib, loaded.example_inputs) if calib else loaded.calibration
    if quantized is not None:
        check_program_file(Path(quantized))
        result = _lower_quantized(loaded, load_program(Path(quantized)), spec, opts, reg, model)
    else:
        from etforge.core.build.session import compile_model

        result = compile_model(
            loaded.module, loaded.example_inputs, spec, calibration=calibration, options=opts,
            program=loaded.program, reg=reg, what=model, early=False,
        )  # fmt: skip
        if data != result.pte:  # etforge compile's own (early) route: an ExecuTorch recipe's default
            early = compile_model(
                loaded.module, loaded.example_inputs, spec, calibration=calibration, options=opts,
                program=loaded.program, reg=reg, what=model, early=True,
            )  # fmt: skip
            result = early if data == early.pte else result
    report = build_report(result, reg, model)
    same = data == result.pte  # the reference is lowered classic (a script's route) or early
    report["pte_sha256"] = hashlib.sha256(data).hexdigest()
    with tempfile.TemporaryDirectory(prefix="etforge-verify-") as tmp:
        out = Path(tmp) / "out"
        with output.replacing(out) as staging:
            output.write_outputs(staging, result, report)
            (staging / output.PTE).write_bytes(data)  # the script's program is the one run
            (staging / output.REPORT).write_text(json.dumps(report, indent=2) + "\n")
        # report.json here is etforge's compile of the model, written beside the script's
        # program: its firmware fields describe etforge's program, not the script's.
        v = verify(out, report_fields=same, **verify_args)
        v.failures = [f.replace(str(out / output.PTE), str(pte)) for f in v.failures]
    source = f"the quantized program {quantized}" if quantized else f"etforge's quantization of {model}"
    v.notes.insert(
        0,
        f"{pte} checked against {source} lowered for {target}: "
        + (
            "byte for byte the program etforge compiles from it"
            if same
            else "not byte-identical to etforge's compile of it; judged by what it computes"
        ),
    )
    if not v.ok and not quantized:
        v.notes.append(
            "a script that quantized with other calibration data computes other values: pass its "
            "quantized program (torch.export.save) with --quantized, or its calibration with --calib"
        )
    return v


def _lower_quantized(loaded: Any, qep: Any, spec: Any, opts: dict[str, Any], reg: Any, what: str) -> Any:
    """A compile result whose quantized program is the script's own, lowered the classic way
    (a script's route); the rest as ``compile``."""
    from etforge.core.build import pipeline
    from etforge.core.build.session import CompileSession
    from etforge.core.front.export import front_end

    if loaded.module is None and loaded.program is None:
        raise EtforgeError(f"{what}: no model to take the float reference from")
    front = front_end(
        loaded.module, loaded.example_inputs, loaded.calibration, spec, opts, reg, loaded.program, what
    )
    session = CompileSession(spec, reg=reg, options=opts, early=False)
    float_ep, _ = pipeline.rewrite(front.program, spec, reg)
    built = session.lower(qep, qep)
    return session.result(float_ep, built, _serialized(built.edge), notes=list(front.notes))


def _serialized(edge: Any) -> Any:
    """The program as ``compile`` serializes it (``.buffer``: the ``.pte`` bytes)."""
    from executorch.exir import EdgeProgramManager

    from etforge.core.build import pipeline

    host = edge.exported_program()
    return pipeline.serialize(
        EdgeProgramManager({"forward": pipeline.clone_program(host)}, compile_config=edge.compile_config),
        host,
    )
