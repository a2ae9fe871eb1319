"""Target options checked in one place, for ``--option k=v`` and ``etforge.compile(options=...)`` alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from etforge.core.common.errors import EtforgeError
from etforge.core.contracts.target import OptionSpec, TargetSpec


def resolve_options(target: TargetSpec, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The target's defaults updated with ``given``; unknown names and ill-typed values are errors.

    Strings (the CLI's ``k=v``) are parsed as the option's type; other values must already
    have it (a list stands for a tuple option).
    """
    known = {o.name: o for o in target.options}
    values = target.option_defaults()
    for key, value in (given or {}).items():
        spec = known.get(key)
        if spec is None:
            names = ", ".join(sorted(known)) or "none"
            raise EtforgeError(f"unknown option {key!r} for target {target.name!r} (known: {names})")
        try:
            values[key] = spec.parse(value) if isinstance(value, str) else _typed(spec, value)
            _in_range(spec, values[key])
            _known_ops(spec, values[key], target)
        except ValueError as exc:
            raise EtforgeError(f"{exc} (target {target.name!r})") from None
    return values


def _in_range(spec: OptionSpec, value: Any) -> None:
    """An integer option at or above its declared minimum; with none declared, a count or a
    duration (a default not below 0) is not negative either."""
    if not isinstance(value, int) or isinstance(value, bool):
        return
    low = spec.minimum
    if low is None and isinstance(spec.default, int) and spec.default >= 0:
        low = 0
    if low is not None and value < low:
        raise ValueError(f"option {spec.name!r} must be at least {low}; got {value}")


def _known_ops(spec: OptionSpec, value: Any, target: TargetSpec) -> None:
    """A list of Edge op names (``operators_*``) names ops the target's converters know: a typo
    would otherwise block nothing, silently."""
    if not spec.name.startswith("operators") or not isinstance(value, tuple) or not value:
        return
    from etforge.core.registry.manager import registry

    known = set(registry().converters_for(target))
    unknown = [v for v in value if v not in known]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], sorted(known), n=3)
        hint = (
            f" (did you mean {', '.join(close)}?)"
            if close
            else f" ({len(known)} known, e.g. {min(known, default='none')})"
        )
        raise ValueError(
            f"option {spec.name!r}: {unknown[0]!r} is no op the target's converters handle{hint}"
        )


def _typed(spec: OptionSpec, value: Any) -> Any:
    default = spec.default
    if isinstance(default, tuple) and isinstance(value, list):
        value = tuple(value)
    kind = type(default)
    ok = isinstance(value, kind) and isinstance(value, bool) == isinstance(default, bool)
    if default is not None and not ok:
        raise ValueError(
            f"option {spec.name!r} takes {kind.__name__} values like its default {default!r}, "
            f"got {type(value).__name__} {value!r}"
        )
    if spec.choices is not None and value not in spec.choices:
        raise ValueError(
            f"option {spec.name!r} must be one of {', '.join(map(str, spec.choices))}; got {value!r}"
        )
    return value
