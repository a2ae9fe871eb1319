"""The public Python API, in ExecuTorch's idiom.

``etforge.compile`` runs the same pipeline as ``etforge compile``. ``etforge.target(name)``
hands an existing ExecuTorch script the two things an upstream backend would: a PT2E
quantizer and partitioners for ``to_edge_transform_and_lower``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class Target:
    """A target as ExecuTorch scripts use a backend: quantizer, partitioners, CPU lowering."""

    name: str
    options: dict[str, Any]

    @property
    def spec(self) -> Any:
        from etforge.core.plugin_manager import registry

        return registry().target(self.name)

    def quantizer(self) -> Any:
        """The torchao PT2E quantizer composed from the target's rule plugins (+ its CPU rules)."""
        from etforge.core.pipeline import quantizer_for
        from etforge.core.plugin_manager import registry

        return quantizer_for(self.spec, self._options(), registry())

    def adapt(
        self,
        model: torch.nn.Module,
        example_inputs: tuple[torch.Tensor, ...],
        calibration: Sequence[tuple[torch.Tensor, ...]] | None = None,
    ) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]] | None]:
        """Model and inputs in the memory format the target keeps inside (before ``torch.export``).

        On Cortex-M targets everything is channels-last, so NPU partitions and CMSIS-NN
        kernels hand NHWC buffers over without conversions (option ``dim_order``).
        """
        from etforge.core.compiler import adapt_layout

        return adapt_layout(model, tuple(example_inputs), calibration, self.spec, self._options())

    def partitioners(self) -> list[Any]:
        """Partitioners for ``to_edge_transform_and_lower(..., partitioner=...)``."""
        from etforge.core.partitioner import EtforgePartitioner

        return [EtforgePartitioner(self.spec, self._options())]

    def compile_config(self) -> Any:
        """The ``EdgeCompileConfig`` the target's CPU backend needs."""
        from etforge.core.pipeline import edge_config
        from etforge.core.plugin_manager import registry

        return registry().cpu_backend(self.spec).edge_compile_config() or edge_config()

    def lower_cpu(self, edge: Any) -> Any:
        """Rewrite what the NPU left into the CPU backend's kernels (CMSIS-NN on imxrt700cm)."""
        from executorch.exir import EdgeProgramManager

        from etforge.core.plugin_manager import registry

        ep = edge.exported_program()
        lowered = registry().cpu_backend(self.spec).lower(ep, self.spec, self._options())
        return (
            edge
            if lowered is ep
            else EdgeProgramManager({"forward": lowered}, compile_config=self.compile_config())
        )

    def _options(self) -> dict[str, Any]:
        from etforge.core.options import resolve_options

        return resolve_options(self.spec, self.options)


def target(name: str = "imxrt700cm", **options: Any) -> Target:
    """``etforge.target("imxrt700cm")`` -> ``.quantizer()``, ``.partitioners()``, ``.lower_cpu(edge)``."""
    from etforge.core.options import resolve_options
    from etforge.core.plugin_manager import registry

    spec = registry().target(name)
    resolve_options(spec, options)  # unknown names and ill-typed values, as the CLI's --option
    _register_out_variants()
    return Target(name, dict(options))


def _register_out_variants() -> None:
    """``to_executorch`` needs the out variants of the quantize/dequantize ops left on the CPU.

    ``etforge compile`` imports them before serializing; a script calling
    ``edge.to_executorch()`` itself would otherwise fail on the first target whose CPU
    lowering leaves ``quantized_decomposed`` ops ("Missing out variants"), unless another
    import (the Cortex-M backend) happened to register them earlier in the process.
    """
    import executorch.kernels.quantized  # noqa: F401


@dataclass
class Compiled:
    """A compiled model: the ExecuTorch program, its partitions and the report."""

    result: Any
    report: dict[str, Any]

    @property
    def program_manager(self) -> Any:
        return self.result.executorch

    @property
    def pte(self) -> bytes:
        return self.result.pte

    @property
    def partitions(self) -> list[Any]:
        return self.result.partitions

    def save(self, out_dir: str | Path) -> Path:
        """Write model.pte, partitions/*.tflite, report.json (and the programs ``verify`` needs)."""
        from etforge.core import output

        out = Path(out_dir)
        with output.replacing(out) as staging:  # OUT replaced whole, only once complete
            output.write_outputs(staging, self.result, self.report)
        return out

    def codegen(self, out_dir: str | Path, **kwargs: Any) -> Any:
        """Firmware sources for this program (see ``etforge codegen``)."""
        import tempfile

        from etforge.codegen import generate

        with tempfile.TemporaryDirectory() as tmp:
            pte = Path(tmp) / "model.pte"
            pte.write_bytes(self.pte)
            return generate(pte, Path(out_dir), report=self.report, **kwargs)

    def verify(
        self, samples: int = 32, seed: int = 0, max_steps: float | None = None, kernels: str = "default"
    ) -> Any:
        """Run on the host (NPU partitions in LiteRT) and compare with torch; see ``etforge verify``."""
        from etforge.runtime.verify import compare

        r = self.result
        return compare(r.host_program, r.float_program, r.quantized_program, self.report,
                       samples=samples, seed=seed, max_steps=max_steps, kernels=kernels)  # fmt: skip


def compile(  # noqa: A001 (the natural name, as in torch.compile)
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    target: str = "imxrt700cm",
    calibration: Sequence[Sequence[torch.Tensor]] | None = None,
    options: dict[str, Any] | None = None,
    quantize: bool = True,
    lowering: str = "early",
) -> Compiled:
    """Compile like ``etforge compile``; ``calibration`` defaults to the example inputs.

    ``lowering="classic"`` delegates the way an ExecuTorch script does (``to_edge_transform_and_lower``
    with :meth:`Target.partitioners`), byte for byte; the default delegates NPU partitions
    before ``to_edge`` (faster; the same partitions, LiteRT tensors named after the ATen graph).
    """
    from etforge.core.compiler import compile_model
    from etforge.core.errors import EtforgeError
    from etforge.core.load import check_calibration, check_inputs, check_weights
    from etforge.core.options import resolve_options
    from etforge.core.plugin_manager import registry
    from etforge.core.report import build_report

    if lowering not in ("early", "classic"):
        raise EtforgeError(f"lowering must be 'early' or 'classic', not {lowering!r}")
    reg = registry()
    spec = reg.target(target)
    parsed = resolve_options(spec, options)  # the same checks as the CLI's --option
    example = tuple(example_inputs)
    what = type(model).__name__
    check_weights(dict(model.state_dict()), what)
    check_inputs(example, f"{what}: example input")
    calib = check_calibration(list(calibration), example, "calibration") if calibration is not None else None
    result = compile_model(
        model,
        example,
        spec,
        calibration=calib,
        options=parsed,
        quantize=quantize,
        reg=reg,
        early=lowering == "early",
    )
    return Compiled(result, build_report(result, reg, what))
