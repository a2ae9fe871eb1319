"""What the plugin manager checks in each item a hook returns, at load time.

A mistake in a plugin's declaration (``ops = "aten.sqrt.default"``, a misspelled LiteRT
builtin, a constraint that is only text) must surface when the plugin loads, naming the
plugin, not as a confusing failure in the middle of a compile. Checks are cheap: nothing
here imports torch, and the LiteRT builtin names are read from the schema's source text.
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from typing import Any

#: An op overload as etforge names it: ``namespace.op.overload`` (``aten.add.Tensor``).
OP_NAME = re.compile(r"[A-Za-z_][\w]*\.[A-Za-z_][\w]*\.[A-Za-z_][\w]*")
#: Element types a converter may declare.
DTYPES = frozenset({"int8", "float32"})


def _is_seq(value: object) -> bool:
    return isinstance(value, (tuple, list))


def _names(value: object, what: str, pattern: re.Pattern[str] | None = None) -> list[str]:
    """Problems with a declared tuple of names (a bare string is the classic mistake)."""
    if isinstance(value, str):
        return [f"{what} must be a tuple of strings, got the string {value!r} (write ({value!r},))"]
    if not _is_seq(value):
        return [f"{what} must be a tuple of strings, got {type(value).__name__}"]
    bad = [v for v in value if not isinstance(v, str)]  # type: ignore[attr-defined]
    if bad:
        return [f"{what} holds a non-string {bad[0]!r}"]
    if pattern is not None:
        wrong = [v for v in value if not pattern.fullmatch(v)]  # type: ignore[attr-defined]
        if wrong:
            return [f"{what}: {wrong[0]!r} is not an op name of the form namespace.op.overload"]
    return []


@lru_cache(maxsize=1)
def litert_builtins() -> frozenset[str]:
    """The LiteRT ``BuiltinOperator`` names of the installed schema.

    Read from ``ai_edge_litert/schema_py_generated.py``'s source (about 20 ms) rather than
    imported (about 250 ms, numpy through flatbuffers), so that describing commands stay fast.
    """
    from etforge.core.common.lazy_imports import module_origin  # find_spec would import ai_edge_litert itself

    origin = module_origin("ai_edge_litert.schema_py_generated")
    if origin:
        with open(origin, encoding="utf-8") as f:
            src = f.read()
        m = re.search(r"^class BuiltinOperator\(object\):\n((?:    \w+ = -?\d+\n)+)", src, re.M)
        if m:
            return frozenset(re.findall(r"^    (\w+) = ", m.group(1), re.M))
    from ai_edge_litert import schema_py_generated as schema  # the text changed shape: import it

    return frozenset(k for k in vars(schema.BuiltinOperator) if k.isupper())


def converter_problems(op_converter: Any) -> list[str]:
    """Problems with an :class:`~etforge.core.contracts.converter.OpConverter`'s declaration."""
    from etforge.core.contracts.converter import Constraint, OpConverter

    name = getattr(op_converter, "name", type(op_converter).__name__)
    out: list[str] = []
    ops = getattr(op_converter, "ops", ())
    out += _names(ops, "ops", OP_NAME)
    if not out and not ops:
        out.append("ops is empty: the converter handles no op")
    out += _names(getattr(op_converter, "preserve", ()), "preserve", OP_NAME)
    folds = getattr(op_converter, "folds", ())
    out += _names(folds, "folds", OP_NAME)
    if folds and type(op_converter).fold_constant is OpConverter.fold_constant:
        out.append("folds ops but does not define fold_constant")
    targets = getattr(op_converter, "targets", None)
    if targets is not None:
        out += _names(targets, "targets")
    out += _names(getattr(op_converter, "reads", ()), "reads")
    dtypes = getattr(op_converter, "dtypes", ())
    problems = _names(dtypes, "dtypes")
    if not problems and set(dtypes) - DTYPES:
        problems.append(f"dtypes: {sorted(set(dtypes) - DTYPES)} not in {sorted(DTYPES)}")
    out += problems
    priority = getattr(op_converter, "priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        out.append(f"priority must be an int, got {priority!r}")
    constraints = getattr(op_converter, "constraints", ())
    if isinstance(constraints, (str, Constraint)) or not _is_seq(constraints):
        out.append(f"constraints must be a tuple, got {type(constraints).__name__}")
    else:
        for c in constraints:
            if not isinstance(c, (str, Constraint)):
                out.append(f"constraints hold a {type(c).__name__}, expected Constraint or str")
    builtins = list(getattr(op_converter, "litert_ops", ()) or ())
    if isinstance(getattr(op_converter, "litert_ops", ()), str):
        out.append("litert_ops must be a tuple of LiteRT builtin names, got a string")
        builtins = []
    single = getattr(op_converter, "litert", None)
    if isinstance(single, str) and single:
        builtins.append(single)
    if builtins:
        known = litert_builtins()
        for b in builtins:
            if b not in known:
                close = difflib.get_close_matches(str(b).upper(), sorted(known), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                out.append(f"{b!r} is not a LiteRT builtin operator{hint}")
    return [f"converter {name}: {p}" for p in out]


def rule_problems(rule: Any) -> list[str]:
    """Problems with a :class:`~etforge.core.contracts.quant_rule.QuantRule`'s declaration."""
    out = _names(rule.ops, "ops", OP_NAME)
    if not out and not rule.ops:
        out.append("ops is empty")
    out += _names(rule.fuse, "fuse", OP_NAME)
    if rule.inputs is not None and (
        not _is_seq(rule.inputs) or not all(isinstance(i, int) for i in rule.inputs)
    ):
        out.append(f"inputs must be a tuple of argument positions, got {rule.inputs!r}")
    if not isinstance(rule.priority, int) or isinstance(rule.priority, bool):
        out.append(f"priority must be an int, got {rule.priority!r}")
    label = ",".join(rule.ops) if _is_seq(rule.ops) else repr(rule.ops)
    return [f"quantizer rule for {label}: {p}" for p in out]


def target_problems(target: Any) -> list[str]:
    """Problems with a :class:`~etforge.core.contracts.target.TargetSpec`: names its NPU spec
    does not declare, options named twice or defaulting outside their own choices."""
    out = _names(target.quant_schemes, "quant_schemes")
    seen: set[str] = set()
    for option in target.options:
        if option.name in seen:
            out.append(f"option {option.name!r} is declared twice")
        seen.add(option.name)
        if option.choices is not None and option.default not in option.choices:
            out.append(
                f"option {option.name!r}: default {option.default!r} is not one of its choices "
                f"({', '.join(map(str, option.choices))})"
            )
    if target.npu is not None:
        out += _names(target.npu.dtypes, "npu.dtypes")
        out += _names(target.npu.fused_activations, "npu.fused_activations")
        bad = [k for k, v in target.npu.limits.items() if not isinstance(v, int)]
        if bad:
            out.append(f"npu.limits[{bad[0]!r}] must be an int")
        out += target.npu.undeclared()
    return [f"target {target.name!r}: {p}" for p in out]


def item_problems(item: object) -> list[str]:
    from etforge.core.contracts.converter import OpConverter
    from etforge.core.contracts.quant_rule import QuantRule
    from etforge.core.contracts.target import TargetSpec

    if isinstance(item, OpConverter):
        return converter_problems(item)
    if isinstance(item, QuantRule):
        return rule_problems(item)
    if isinstance(item, TargetSpec):
        return target_problems(item)
    return []
