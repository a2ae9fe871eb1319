"""Target specs: a chip is data (NPU limits, CPU fallback, quantizer schemes, options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OptionSpec:
    """A compile option a target accepts (``--option name=value``)."""

    name: str
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None

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


@dataclass(frozen=True)
class NpuSpec:
    """An NPU's limits, read by op converters' support checks (never by the core)."""

    family: str
    #: MACs per cycle; rounds input channels in the weight-buffer limit.
    num_macs: int = 16
    #: Free-form numeric limits, e.g. {"max_kernel": 4096, "max_stride": 4096}.
    limits: dict[str, int] = field(default_factory=dict)
    #: Activations a conv/linear may fuse (LiteRT names: "RELU", "RELU6", ...).
    fused_activations: tuple[str, ...] = ("RELU", "RELU6")
    #: Element types the NPU executes ("int8", "float32").
    dtypes: tuple[str, ...] = ("int8",)
    #: Name of the NPU compiler adapter that turns a partition into a payload.
    compiler: str | None = None
    #: Where each number comes from.
    sources: dict[str, str] = field(default_factory=dict)

    def limit(self, key: str, default: int) -> int:
        return self.limits.get(key, default)


@dataclass(frozen=True)
class TargetSpec:
    """A compilation target."""

    name: str
    description: str
    #: ``None``: no NPU, everything runs on the CPU.
    npu: NpuSpec | None = None
    #: How the non-NPU leftovers run: "portable" kernels or "cortex_m" (CMSIS-NN).
    cpu_fallback: str = "portable"
    #: Cortex-M core name recorded in the report and model header.
    cpu: str = "cortex-m33"
    #: Quantizer-rule schemes composed (in order) into the target's PT2E quantizer.
    quant_schemes: tuple[str, ...] = ("int8",)
    options: tuple[OptionSpec, ...] = ()

    def option_defaults(self) -> dict[str, Any]:
        return {o.name: o.default for o in self.options}

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
                "num_macs": self.npu.num_macs,
                "limits": dict(self.npu.limits),
                "fused_activations": list(self.npu.fused_activations),
                "dtypes": list(self.npu.dtypes),
                "compiler": self.npu.compiler,
            },
            "cpu_fallback": self.cpu_fallback,
            "cpu": self.cpu,
            "quant_schemes": list(self.quant_schemes),
            "options": [{"name": o.name, "default": o.default, "help": o.help} for o in self.options],
        }
