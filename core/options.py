"""Target options checked in one place, for ``--option k=v`` and ``etforge.compile(options=...)`` alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from etforge.core.errors import EtforgeError
from etforge.core.target import OptionSpec, TargetSpec


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
        except ValueError as exc:
            raise EtforgeError(f"{exc} (target {target.name!r})") from None
    return values


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
