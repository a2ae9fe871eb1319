"""The public Python API, in ExecuTorch's idiom.

``etforge.compile`` runs the same pipeline as ``etforge compile``. ``etforge.target(name)``
hands an existing ExecuTorch script the two things an upstream backend would: a PT2E
quantizer and partitioners for ``to_edge_transform_and_lower``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def _quiet(fn: F) -> F:
    """Run ``fn`` with the third-party noise the CLI hides silenced (``core.common.quiet.scope``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from etforge.core.common.quiet import scope

        with scope():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@dataclass
class Target:
    """A target as ExecuTorch scripts use a backend: quantizer, partitioners, CPU lowering."""

    name: str
    options: dict[str, Any]

    @property
    def spec(self) -> Any:
        from etforge.core.registry.manager import registry

        return registry().target(self.name)

    @_quiet
    def quantizer(self, qat: bool = False) -> Any:
        """The torchao PT2E quantizer composed from the target's rule plugins (+ its CPU rules);
        ``qat``: with fake-quantize specs, for ``prepare_qat_pt2e`` (``etforge.qat``)."""
        from etforge.core.build.pipeline import quantizer_for
        from etforge.core.registry.manager import registry

        reg = registry()
        inner = quantizer_for(self.spec, self._options(), reg, is_qat=qat)
        if not [r for r in reg.rewrites_for(self.spec) if r.stage == "export"]:
            return inner
        return _rewriting_quantizer(inner, self.spec, reg)

    @_quiet
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
        from etforge.core.front.export import adapt_layout

        return adapt_layout(model, tuple(example_inputs), calibration, self.spec, self._options())

    @_quiet
    def partitioners(self) -> list[Any]:
        """Partitioners for ``to_edge_transform_and_lower(..., partitioner=...)``."""
        return [_script_partitioner(self.spec, self._options())]

    @_quiet
    def compile_config(self) -> Any:
        """The ``EdgeCompileConfig`` the target's CPU backend needs."""
        from etforge.core.build.pipeline import edge_config
        from etforge.core.registry.manager import registry

        return registry().cpu_backend(self.spec).edge_compile_config() or edge_config()

    @_quiet
    def lower_cpu(self, edge: Any) -> Any:
        """Rewrite what the NPU left into the CPU backend's kernels (CMSIS-NN on imxrt700cm).

        The same steps as ``etforge.compile``'s lowering after delegation; the result's
        ``to_executorch()`` plans memory as ``etforge.compile`` does (its best-fit planner),
        so the script's ``.pte`` is byte for byte ``etforge.compile(..., lowering="classic")``'s.
        """
        from etforge.core.build import pipeline
        from etforge.core.lower import delegate_stubs
        from etforge.core.registry.manager import registry

        ep = edge.exported_program()
        with delegate_stubs.shape_only(ep):
            lowered = registry().cpu_backend(self.spec).lower(ep, self.spec, self._options())
            delegate_stubs.restore(lowered)
        pipeline.drop_dead_constants(lowered)
        self._check_kernels(lowered)
        return _script_edge({"forward": lowered}, self.compile_config())

    def _check_kernels(self, lowered: Any) -> None:
        """A CPU op the device's kernel libraries lack is refused, not left in the script's program.

        ``etforge.compile`` decomposes such an op in the float program and quantizes again; a
        script's float program is its own, so it is told which op and how to get that.
        """
        from etforge.core.common.errors import EtforgeError
        from etforge.core.lower import kernel_check
        from etforge.core.registry.manager import registry

        libraries = kernel_check.libraries_for(registry().cpu_backend(self.spec))
        missing = kernel_check.missing_kernels(lowered, libraries)
        if missing:
            ops = sorted({m.op for m in missing})
            raise EtforgeError(
                f"{self.name}: no kernel for {', '.join(ops)} in the device's kernel libraries; "
                "etforge.compile decomposes such ops in the float program and quantizes again "
                "(use it, or replace the op in the model)"
            )

    def _options(self) -> dict[str, Any]:
        from etforge.core.registry.options import resolve_options

        return resolve_options(self.spec, self.options)


def _script_edge(programs: dict[str, Any], compile_config: Any) -> Any:
    """An ``EdgeProgramManager`` whose ``to_executorch()`` defaults to etforge's memory planning
    (defined here: ``import etforge`` does not import ExecuTorch)."""
    from executorch.exir import EdgeProgramManager, ExecutorchBackendConfig

    from etforge.core.serialize.memory_plan import planning_pass

    class ScriptEdge(EdgeProgramManager):
        @_quiet
        def to_executorch(self, config: Any = None) -> Any:
            _register_out_variants()
            if config is None:
                config = ExecutorchBackendConfig(memory_planning_pass=planning_pass())
            return super().to_executorch(config)

    return ScriptEdge(programs, compile_config=compile_config)


def _rewriting_quantizer(inner: Any, spec: Any, reg: Any) -> Any:
    """``inner``, after the target's graph rewrites (``etforge_rewrites``) on the float graph.

    ``etforge.compile`` rewrites the exported float program before quantizing; a script hands
    ``prepare_pt2e`` the exported module, so the rewrites run in the quantizer's
    ``transform_for_annotation``, the one hook PT2E calls on the float graph first: the
    same rewrites, re-exported the same way (``pipeline.rewrite``).
    """
    from torchao.quantization.pt2e.quantizer import Quantizer

    from etforge.core.build.pipeline import rewrite

    class RewritingQuantizer(Quantizer):  # type: ignore[misc]
        @_quiet
        def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            example = tuple(_example_like(n.meta["val"]) for n in model.graph.find_nodes(op="placeholder"))
            ep, applied = rewrite(torch.export.export(model, example, strict=False), spec, reg)
            if applied:
                model = ep.module(check_guards=False)
            return inner.transform_for_annotation(model)

        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            return inner.annotate(model)

        def validate(self, model: torch.fx.GraphModule) -> None:
            return inner.validate(model)

        def prepare_obs_or_fq_callback(self, model: Any, edge_or_node_to_obs_or_fq: Any) -> None:
            return inner.prepare_obs_or_fq_callback(model, edge_or_node_to_obs_or_fq)

    return RewritingQuantizer()


def _example_like(val: Any) -> Any:
    """A real tensor of ``val``'s shape, dtype and strides (a channels-last input stays so)."""
    if not isinstance(val, torch.Tensor):
        return val
    return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype).zero_()


def _script_partitioner(spec: Any, options: dict[str, Any]) -> Any:
    """The NPU partitioner, plus what ``etforge.compile``'s lowering does around it.

    ``to_edge_transform_and_lower`` ignores ``compile_config.preserve_ops`` once a
    partitioner is given, so a CPU backend's kept-whole ops (CMSIS-NN's ``linear``) would
    decompose to ``addmm`` and stay float; ``etforge.compile`` keeps them (``to_edge`` with
    them preserved). This partitioner asks ExecuTorch to keep the same set whole: the CPU
    backend's and the converters' (``driver._kept_whole``), so the script's program is
    the same, byte for byte. The check ExecuTorch runs after delegation (on the Edge
    program) is asked for nothing: the kept ops left there are ``lower_cpu``'s to rewrite.
    """
    from etforge.core.lower.driver import _kept_whole
    from etforge.core.lower.partitioner import EtforgePartitioner
    from etforge.core.registry.manager import registry

    config = registry().cpu_backend(spec).edge_compile_config()

    class ScriptPartitioner(EtforgePartitioner):
        @_quiet
        def ops_to_not_decompose(self, ep: Any) -> tuple[list[Any], Any]:
            ours = super().ops_to_not_decompose(ep)
            if not getattr(config, "preserve_ops", None):
                return ours
            if ep.dialect == "EDGE":
                return [], None
            return _kept_whole(config, self), None

        @_quiet
        def partition(self, exported_program: Any) -> Any:
            return super().partition(exported_program)

    return ScriptPartitioner(spec, options)


@_quiet
def target(name: str = "imxrt700cm", **options: Any) -> Target:
    """``etforge.target("imxrt700cm")`` -> ``.quantizer()``, ``.partitioners()``, ``.lower_cpu(edge)``."""
    from etforge.core.registry.manager import registry
    from etforge.core.registry.options import resolve_options

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

    @_quiet
    def save(self, out_dir: str | Path) -> Path:
        """Write model.pte, partitions/*.tflite, report.json (and the programs ``verify`` needs)."""
        from etforge.core.build import output

        out = Path(out_dir)
        with output.replacing(out) as staging:  # OUT replaced whole, only once complete
            output.write_outputs(staging, self.result, self.report)
        return out

    @_quiet
    def codegen(self, out_dir: str | Path, **kwargs: Any) -> Any:
        """Firmware sources for this program (see ``etforge codegen``)."""
        import tempfile

        from etforge.codegen import generate

        with tempfile.TemporaryDirectory() as tmp:
            pte = Path(tmp) / "model.pte"
            pte.write_bytes(self.pte)
            return generate(pte, Path(out_dir), report=self.report, **kwargs)

    @_quiet
    def verify(
        self, samples: int = 32, seed: int = 0, max_steps: float | None = None, kernels: str = "default"
    ) -> Any:
        """``etforge verify`` of this compile: the same path, every gate (the output is saved to a
        temporary directory and verified there, as the command line verifies OUT)."""
        import tempfile

        from etforge.runtime.verification.verify import verify

        with tempfile.TemporaryDirectory(prefix="etforge-verify-") as tmp:
            out = self.save(Path(tmp) / "out")
            return verify(out, samples=samples, seed=seed, max_steps=max_steps, kernels=kernels)


@_quiet
def compile(  # noqa: A001 (the natural name, as in torch.compile)
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    target: str = "imxrt700cm",
    calibration: Sequence[Sequence[torch.Tensor]] | None = None,
    options: dict[str, Any] | None = None,
    quantize: bool = True,
    lowering: str = "early",
    strict: bool = False,
    memory_budget: int | None = None,
) -> Compiled:
    """Compile like ``etforge compile``; ``calibration`` defaults to the example inputs.

    ``strict`` (``etforge compile --no-fallback``): a second-best path (``report["fallbacks"]``)
    is an error, :class:`etforge.core.common.fallbacks.StrictFallback`. ``memory_budget``
    (bytes, ``--memory-budget``): the planned arena, beside each NPU partition's working
    memory, must fit it.

    The compile is the command line's: one :class:`~etforge.core.build.session.CompileSession`
    (the CLI adds its cache, ``codegen`` and writing OUT on top).

    ``lowering="classic"`` delegates the way an ExecuTorch script does (``to_edge_transform_and_lower``
    with :meth:`Target.partitioners`), byte for byte; the default delegates NPU partitions
    before ``to_edge`` (faster; the same partitions, LiteRT tensors named after the ATen graph).
    """
    from etforge.core.build.report import build_report
    from etforge.core.build.session import CompileSession
    from etforge.core.common.errors import EtforgeError
    from etforge.core.front.load import check_calibration, check_inputs, check_weights
    from etforge.core.registry.manager import registry
    from etforge.core.registry.options import resolve_options

    if lowering not in ("early", "classic"):
        raise EtforgeError(f"lowering must be 'early' or 'classic', not {lowering!r}")
    reg = registry()
    spec = reg.target(target)
    parsed = resolve_options(spec, options)  # the same checks as the CLI's --option
    example = tuple(example_inputs)
    what = type(model).__name__
    if isinstance(model, torch.fx.GraphModule) and "etforge_qat" in model.meta:  # qat.PREPARED_KEY
        prepared_for = model.meta["etforge_qat"].get("target")
        other = f", not {target!r} (prepare the float model for {target!r})" if prepared_for != target else ""
        raise EtforgeError(
            f"{what} was prepared for quantization-aware training on {prepared_for!r}{other}: compile it "
            "with etforge.qat.compile (etforge.compile would quantize its fake-quantized graph again)"
        )
    check_weights(dict(model.state_dict()), what)
    check_inputs(example, f"{what}: example input")
    calib = check_calibration(list(calibration), example, "calibration") if calibration is not None else None
    session = CompileSession(
        spec,
        reg=reg,
        options=parsed,
        quantize=quantize,
        early=lowering == "early",
        strict=strict,
        memory_budget=memory_budget,
    )
    result = session.run(model, example, calibration=calib, what=what)
    return Compiled(result, build_report(result, reg, what))
