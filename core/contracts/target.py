"""Target specs: a chip is data (NPU limits, CPU fallback, quantizer schemes, options)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OptionSpec:
    """A compile option a target accepts (``--option name=value``)."""

    name: str
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    #: False for options that only steer the build (a timeout): they stay out of the
    #: ``.pte``'s compile specs and the build cache's key, so they never change the output.
    affects_output: bool = True
    #: The smallest value an integer option takes (None: any value not below 0 when the
    #: default is not negative, see core/registry/options.py).
    minimum: int | None = None

    def parse(self, raw: str) -> Any:
        """Parse a CLI string to the option's type (that of its default)."""
        value: Any
        if isinstance(self.default, bool):
            if raw.lower() not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise ValueError(f"option {self.name!r} takes a boolean, got {raw!r}")
            value = raw.lower() in {"1", "true", "yes", "on"}
        elif isinstance(self.default, int):
            try:
                value = int(raw, 0)
            except ValueError:
                raise ValueError(f"option {self.name!r} takes an integer, got {raw!r}") from None
        elif isinstance(self.default, tuple):
            value = tuple(v.strip() for v in raw.split(",") if v.strip())
        else:
            value = raw
        if self.choices is not None and value not in self.choices:
            raise ValueError(
                f"option {self.name!r} must be one of {', '.join(map(str, self.choices))}; got {raw!r}"
            )
        return value


#: Vendor figures read through an NPU's ``probe``, per probe and device (one query per process).
_PROBED: dict[tuple[str, str], dict[str, Any]] = {}


@dataclass(frozen=True)
class NpuSpec:
    """An NPU's limits, read by op converters' support checks (never by the core).

    Everything a converter needs to decide is data here: integer ``limits``, allowed value
    sets in ``choices`` and named ``requires`` flags (each converter documents the flags it
    honours). A figure listed in ``assumptions`` is not vendor data; when the vendor SDK is
    installed, ``probe`` reads the real figures and they replace it (see :meth:`figure`).
    """

    family: str
    #: MACs per cycle; rounds input channels in the weight-buffer limit.
    num_macs: int = 16
    #: Free-form numeric limits, e.g. {"max_kernel": 4096, "max_stride": 4096}.
    limits: dict[str, int] = field(default_factory=dict)
    #: LiteRT fused activations the NPU applies inside a producing op ("RELU", "RELU6",
    #: ...); none unless the target says so. Activation converters say which nodes are which.
    fused_activations: tuple[str, ...] = ()
    #: Element types the NPU executes ("int8", "float32").
    dtypes: tuple[str, ...] = ("int8",)
    #: Name of the NPU compiler adapter that turns a partition into a payload.
    compiler: str | None = None
    #: Where each number comes from.
    sources: dict[str, str] = field(default_factory=dict)
    #: Allowed values, e.g. {"resize_scales": (1, 2, 4, 8)}.
    choices: dict[str, tuple[float, ...]] = field(default_factory=dict)
    #: Named requirements converters enforce, e.g. "binary_full_size_operand".
    requires: tuple[str, ...] = ()
    #: Figures that are assumptions, not vendor data: figure -> why the value was chosen.
    assumptions: dict[str, str] = field(default_factory=dict)
    #: "module:function(device) -> {figure: value}" reading figures from the vendor SDK
    #: ({} when it is not installed); the module must not import torch.
    probe: str | None = None
    #: The vendor's name of the NPU variant (the chip), e.g. "imxrt700": the NPU compiler
    #: builds every partition for it and ``probe`` reads its figures.
    device: str | None = None
    #: The names this NPU family understands -- ``requires`` flags, ``limits`` and ``choices``
    #: keys -- each with what it means. A spec naming anything not declared here is refused at
    #: load (a misspelt flag would otherwise silently switch a hardware rule off).
    declares: dict[str, str] = field(default_factory=dict)
    #: Whether converters that name no NPU (``OpConverter.targets`` None) apply here: True for
    #: a host LiteRT target that checks any converter, False for a chip's NPU (a converter
    #: reaches it only by naming its family, its target or every NPU).
    takes_undeclared_converters: bool = False
    #: Bytes a host-only partition (no NPU code) needs where the target's device can run it
    #: instead of the NPU, from its LiteRT flatbuffer, and what that figure is: shown beside
    #: the NPU working memory (report, summary, model header). None: nowhere on the device.
    fallback_arena: Callable[[bytes], int] | None = None
    fallback_arena_note: str = ""

    def limit(self, key: str, default: int) -> int:
        return self.limits.get(key, default)

    def requirement(self, flag: str) -> bool:
        return flag in self.requires

    def derive(self, **changes: Any) -> NpuSpec:
        """This spec for another chip of the family: ``limits``, ``choices``, ``sources`` and
        ``assumptions`` given here are merged over this spec's (so name only what differs);
        every other field given replaces this one's (``dataclasses.replace``)."""
        import dataclasses

        for name in ("limits", "choices", "sources", "assumptions"):
            if name in changes:
                changes[name] = {**getattr(self, name), **changes[name]}
        return dataclasses.replace(self, **changes)

    def undeclared(self) -> list[str]:
        """Names in ``requires`` / ``limits`` / ``choices`` that ``declares`` does not list, each
        with a spelling hint and what is declared: a name nobody reads would switch a hardware
        rule off without a word. A spec that names any must declare them."""
        import difflib

        named = (
            ("requires", self.requires),
            ("limits", tuple(self.limits)),
            ("choices", tuple(self.choices)),
        )
        if not self.declares:
            return [
                f"npu.{what}: {name!r} is not declared: the {self.family} spec declares no names "
                "(NpuSpec.declares lists every flag and key the spec's readers understand)"
                for what, names in named
                for name in names
            ]
        declared = ", ".join(sorted(self.declares))
        out = []
        for what, names in named:
            for name in names:
                if name not in self.declares:
                    close = difflib.get_close_matches(name, sorted(self.declares), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    out.append(
                        f"npu.{what}: {name!r} is not declared by the {self.family} spec{hint}; "
                        f"declared: {declared}"
                    )
        return out

    def vendor_figures(self) -> dict[str, Any]:
        """Figures the vendor SDK reports for ``device`` ({} without a probe or the SDK)."""
        if not self.probe:
            return {}
        key = (self.probe, self.device or "")
        if key not in _PROBED:
            import importlib

            module, func = self.probe.split(":")
            _PROBED[key] = dict(getattr(importlib.import_module(module), func)(self.device) or {})
        return _PROBED[key]

    def figure(self, name: str) -> Any:
        """A device figure (e.g. ``num_macs``): the vendor SDK's value when it reports one, else ours."""
        vendor = self.vendor_figures()
        if name in vendor:
            return vendor[name]
        return getattr(self, name) if hasattr(self, name) else self.limits[name]

    def figure_source(self, name: str) -> str:
        """Where :meth:`figure` takes ``name`` from, saying so when it is an assumption."""
        if name in self.vendor_figures():
            return f"read from the vendor SDK for {self.device} ({self.probe})"
        if name in self.assumptions:
            return f"assumption: {self.assumptions[name]}"
        return self.sources.get(name, "")

    def is_assumption(self, name: str) -> bool:
        return name in self.assumptions and name not in self.vendor_figures()

    def figures(self) -> dict[str, dict[str, Any]]:
        """Every assumed or vendor-read figure: value, source, whether it is an assumption."""
        names = sorted(set(self.assumptions) | set(self.vendor_figures()))
        return {
            n: {"value": self.figure(n), "assumption": self.is_assumption(n), "source": self.figure_source(n)}
            for n in names
        }


@dataclass(frozen=True)
class TargetSpec:
    """A compilation target."""

    name: str
    description: str
    #: ``None``: no NPU, everything runs on the CPU.
    npu: NpuSpec | None = None
    #: How the non-NPU leftovers run: "portable" kernels or "cortex_m" (CMSIS-NN).
    cpu_fallback: str = "portable"
    #: CPU core name recorded in the report and model header ("" when the target names none).
    cpu: str = ""
    #: Quantizer-rule schemes composed (in order) into the target's PT2E quantizer.
    quant_schemes: tuple[str, ...] = ("int8",)
    options: tuple[OptionSpec, ...] = ()

    def option_defaults(self) -> dict[str, Any]:
        return {o.name: o.default for o in self.options}

    def output_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options that determine the output (see :attr:`OptionSpec.affects_output`)."""
        build_only = {o.name for o in self.options if not o.affects_output}
        return {k: v for k, v in options.items() if k not in build_only}

    def parse_options(self, pairs: dict[str, str]) -> dict[str, Any]:
        """Validate ``k=v`` options against this target; unknown names are errors."""
        known = {o.name: o for o in self.options}
        values = self.option_defaults()
        for key, raw in pairs.items():
            if key not in known:
                names = ", ".join(sorted(known)) or "none"
                raise ValueError(f"unknown option {key!r} for target {self.name!r} (known: {names})")
            values[key] = known[key].parse(raw)
        return values

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "npu": None
            if self.npu is None
            else {
                "family": self.npu.family,
                "num_macs": self.npu.figure("num_macs"),
                "figures": self.npu.figures(),
                "limits": dict(self.npu.limits),
                "choices": {k: list(v) for k, v in self.npu.choices.items()},
                "requires": list(self.npu.requires),
                "fused_activations": list(self.npu.fused_activations),
                "dtypes": list(self.npu.dtypes),
                "compiler": self.npu.compiler,
                "device": self.npu.device,
            },
            "cpu_fallback": self.cpu_fallback,
            "cpu": self.cpu,
            "quant_schemes": list(self.quant_schemes),
            "options": [{"name": o.name, "default": o.default, "help": o.help} for o in self.options],
        }
