"""Loads plugins from the ``etforge`` entry-point group and validates what their hooks return.

Built-ins come through the same entry points as third-party plugins: there is no list of
them here. Each plugin is loaded and each hook called in isolation, so one broken plugin
is reported (distribution, version, entry point) while the others keep working.
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pluggy

from etforge.core.common.errors import PluginError
from etforge.core.contracts import hookspecs
from etforge.core.contracts.converter import OpConverter
from etforge.core.contracts.cpu_backend import CpuBackend
from etforge.core.contracts.npu_compiler import NpuCompiler
from etforge.core.contracts.partition_check import PartitionCheck
from etforge.core.contracts.quant_rule import QuantRule
from etforge.core.contracts.rewrite import Rewrite
from etforge.core.contracts.target import TargetSpec
from etforge.core.contracts.verify_gate import VerifyGate
from etforge.core.registry.checks import item_problems

#: hook name -> (type each item must have, provides-key)
HOOKS: dict[str, tuple[type, str]] = {
    "etforge_op_converters": (OpConverter, "converters"),
    "etforge_quantizer_rules": (QuantRule, "quantizer_rules"),
    "etforge_targets": (TargetSpec, "targets"),
    "etforge_npu_compilers": (NpuCompiler, "npu_compilers"),
    "etforge_cpu_backends": (CpuBackend, "cpu_backends"),
    "etforge_rewrites": (Rewrite, "rewrites"),
    "etforge_partition_checks": (PartitionCheck, "partition_checks"),
    "etforge_verify_gates": (VerifyGate, "verify_gates"),
}


@dataclass
class PluginInfo:
    """One entry point: where it came from and what it provided (or why it failed)."""

    name: str
    distribution: str
    version: str
    entry_point: str
    provides: dict[str, list[Any]] = field(default_factory=dict)
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.version}, entry point {self.name!r} ({self.entry_point})"


@dataclass(frozen=True)
class Conflict:
    """Two converters claim ``op`` on ``target``; ``order`` is who is asked first."""

    op: str
    target: str
    order: tuple[tuple[str, str, int], ...]  # (plugin, converter, priority)
    note: str


@dataclass(frozen=True)
class RuleConflict:
    """Two quantizer rules claim ``op`` in ``scheme``; the first in ``order`` annotates it."""

    op: str
    scheme: str
    order: tuple[tuple[str, str, int], ...]  # (plugin, rule kind, priority)
    note: str


class Registry:
    """Everything the plugins provide, with per-target converter resolution."""

    def __init__(self, plugins: list[PluginInfo], strict: bool = False) -> None:
        self.plugins = plugins
        #: ``--strict``: a plugin that misbehaves while compiling (a support check that
        #: raises) is an error too, not a reason to move the node to the CPU.
        self.strict = strict
        self._owner: dict[int, PluginInfo] = {}
        for p in plugins:
            for items in p.provides.values():
                for item in items:
                    self._owner[id(item)] = p

    # -- lookups ---------------------------------------------------------------------------
    def _all(self, key: str) -> list[Any]:
        return [item for p in self.plugins for item in p.provides.get(key, [])]

    @property
    def errors(self) -> list[PluginInfo]:
        return [p for p in self.plugins if p.error]

    def owner(self, item: object) -> str:
        """The entry-point name of the plugin that provided ``item`` ("?" if none did)."""
        info = self._owner.get(id(item))
        return info.name if info else "?"

    def owner_label(self, item: object) -> str:
        """``plugin 'name' (distribution version)`` for messages that must name the plugin."""
        info = self._owner.get(id(item))
        return (
            f"plugin {info.name!r} ({info.distribution} {info.version})" if info else "an unregistered plugin"
        )

    @property
    def converters(self) -> list[OpConverter]:
        return self._all("converters")

    @property
    def quantizer_rules(self) -> list[QuantRule]:
        return self._all("quantizer_rules")

    @property
    def npu_compilers(self) -> dict[str, NpuCompiler]:
        return self._by_name("npu_compilers", "NPU compiler")

    def _by_name(self, hook: str, kind: str) -> dict[str, Any]:
        """Named contributions; two plugins giving one name is an error naming both (never a
        silent first- or last-wins)."""
        out: dict[str, Any] = {}
        for item in self._all(hook):
            name = item.name
            if name in out and out[name] is not item:
                raise PluginError(
                    f"{kind} {name!r} is defined twice: by {self.owner_label(out[name])} and by "
                    f"{self.owner_label(item)}; rename one (names select it on the command line)"
                )
            out[name] = item
        return out

    @property
    def rewrites(self) -> list[Rewrite]:
        return self._all("rewrites")

    @property
    def partition_checks(self) -> list[PartitionCheck]:
        return self._all("partition_checks")

    def rewrites_for(self, target: TargetSpec) -> list[Rewrite]:
        """The rewrites that apply to ``target``, in run order (order, plugin, name)."""
        mine = [r for r in self.rewrites if r.applies_to(target)]
        return sorted(mine, key=lambda r: (r.order, self.owner(r), r.name))

    @property
    def verify_gates(self) -> dict[str, VerifyGate]:
        """The plugins' verify gates by name, in plugin order."""
        return self._by_name("verify_gates", "verify gate")

    @property
    def cpu_backends(self) -> dict[str, CpuBackend]:
        return self._by_name("cpu_backends", "CPU backend")

    def cpu_backend(self, target: TargetSpec) -> CpuBackend:
        backends = self.cpu_backends
        if target.cpu_fallback not in backends:
            known = ", ".join(sorted(backends)) or "none"
            raise PluginError(
                f"target {target.name!r} needs CPU backend {target.cpu_fallback!r}; loaded: {known}"
            )
        return backends[target.cpu_fallback]

    @property
    def targets(self) -> dict[str, TargetSpec]:
        return self._by_name("targets", "target")

    def target(self, name: str) -> TargetSpec:
        """The target called ``name``, once its NPU compiler (if loaded) accepts its chip."""
        targets = self.targets
        if name not in targets:
            known = ", ".join(sorted(targets)) or "none (no target plugin loaded)"
            raise PluginError(f"unknown target {name!r}; known targets: {known}")
        target = targets[name]
        compiler = self.npu_compilers.get(target.npu.compiler or "") if target.npu is not None else None
        problem = compiler.target_problem(target) if compiler is not None else ""
        if problem:
            raise PluginError(f"target {name!r}: {problem}")
        return target

    def rules_for(self, target: TargetSpec) -> list[QuantRule]:
        """The target's rules, in scheme order then by descending priority (ties: load order).

        For an op claimed by several rules the first one annotates it (see ``rule_conflicts``).
        """
        rules = self.quantizer_rules
        out: list[QuantRule] = []
        for scheme in target.quant_schemes:
            out.extend(sorted((r for r in rules if r.scheme == scheme), key=lambda r: -r.priority))
        return out

    def rule_conflicts(self) -> list[RuleConflict]:
        """Ops claimed by more than one quantizer rule of a scheme, and which rule wins."""
        by_key: dict[tuple[str, str], list[QuantRule]] = {}
        for rule in self.quantizer_rules:
            for op in dict.fromkeys(rule.ops):
                by_key.setdefault((rule.scheme, op), []).append(rule)
        out: list[RuleConflict] = []
        for (scheme, op), rules in sorted(by_key.items()):
            if len(rules) < 2:
                continue
            rules = sorted(rules, key=lambda r: -r.priority)  # stable: load order breaks ties
            tie = rules[0].priority == rules[1].priority
            note = (
                "equal priority: the first loaded wins; set `priority` to make it explicit"
                if tie
                else f"{self.owner(rules[0])}'s rule overrides; the others are ignored for this op"
            )
            order = tuple((self.owner(r), r.kind, r.priority) for r in rules)
            out.append(RuleConflict(op, scheme, order, note))
        return out

    def coverage_warnings(self) -> list[str]:
        """Converter and quantizer-rule op lists that do not meet, and unchecked constraints.

        Warnings, not errors: a float-only converter needs no rule, a rule may quantize an
        ATen op that decomposes into ops other converters handle (or that a CPU backend
        runs), and a constraint may be documentation of what ``check`` enforces.
        """
        out: list[str] = []
        ruled = {op for r in self.quantizer_rules for op in (*r.ops, *r.fuse)}
        handled = {op for c in self.converters for op in (*c.ops, *c.preserve)}
        for op_converter in self.converters:
            if (
                "int8" in op_converter.dtypes
                and not (set(op_converter.ops) | set(op_converter.preserve)) & ruled
            ):
                out.append(
                    f"converter {op_converter.name} ({self.owner_label(op_converter)}) takes int8 but no quantizer "
                    f"rule names {', '.join(op_converter.ops)}: on int8 targets nothing quantizes these ops"
                )
            texts = [c for c in op_converter.constraints if isinstance(c, str)]
            if texts:
                out.append(
                    f"converter {op_converter.name} ({self.owner_label(op_converter)}) advertises free-text "
                    f"constraints that no check is tied to: {'; '.join(texts)}"
                )
        for rule in self.quantizer_rules:
            orphans = [op for op in rule.ops if op not in handled]
            if orphans and len(orphans) == len(rule.ops):
                out.append(
                    f"quantizer rule for {', '.join(rule.ops)} ({self.owner_label(rule)}): "
                    "no converter handles these ops (fine if they decompose into ops one does)"
                )
        return out

    def converters_for(self, target: TargetSpec) -> dict[str, list[OpConverter]]:
        """op name -> candidate converters, highest priority first (ties: plugin name)."""
        table: dict[str, list[OpConverter]] = {}
        for op_converter in self.converters:
            if op_converter.applies_to(target):
                for op in op_converter.ops:
                    table.setdefault(op, []).append(op_converter)
        for cands in table.values():
            cands.sort(key=lambda c: (-c.priority, self.owner(c), c.name))
        return table

    def conflicts(self) -> list[Conflict]:
        out: list[Conflict] = []
        for tname, target in sorted(self.targets.items()):
            for op, cands in sorted(self.converters_for(target).items()):
                if len(cands) < 2:
                    continue
                tie = cands[0].priority == cands[1].priority
                note = (
                    "equal priority: order falls back to plugin name; set `priority` to make it explicit"
                    if tie
                    else f"{cands[0].name} overrides; the others are asked only for nodes it refuses"
                )
                order = tuple((self.owner(c), c.name, c.priority) for c in cands)
                out.append(Conflict(op, tname, order, note))
        return out


def _validate(plugin: PluginInfo, hook: str, result: object) -> list[Any]:
    """The hook's items, or :class:`PluginError` naming the plugin and the first problem."""
    expected, _ = HOOKS[hook]
    if not isinstance(result, (list, tuple)):
        raise PluginError(
            f"plugin {plugin.label}: hook {hook}() returned {type(result).__name__}, expected a list of {expected.__name__}"
        )
    for item in result:
        if not isinstance(item, expected):
            raise PluginError(
                f"plugin {plugin.label}: hook {hook}() returned an item of type {type(item).__name__}, "
                f"expected {expected.__module__}.{expected.__name__}"
            )
        problems = item_problems(item)
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            raise PluginError(f"plugin {plugin.label}: hook {hook}(): {problems[0]}{more}")
    return list(result)


def _entry_points() -> list[md.EntryPoint]:
    eps = md.entry_points(group=hookspecs.ENTRY_POINT_GROUP)
    # Deterministic order whatever the filesystem says; duplicates (same dist seen twice) dropped.
    seen: set[tuple[str, str]] = set()
    out = []
    for ep in sorted(eps, key=lambda e: ((e.dist.name if e.dist else ""), e.name)):
        key = ((ep.dist.name if ep.dist else ""), ep.name)
        if key not in seen:
            seen.add(key)
            out.append(ep)
    return out


def _checked_names(reg: Registry) -> Registry:
    """``reg``, after marking as broken every plugin whose converter reads an NPU name
    (``OpConverter.reads``: a limit, choice or flag) that no loaded NPU spec declares: a
    misspelt key would otherwise read as "no limit" and switch a hardware rule off."""
    declared: dict[str, str] = {}
    for target in (t for p in reg.plugins for t in p.provides.get("targets", [])):
        if target.npu is not None:
            for name in target.npu.declares:
                declared.setdefault(name, target.npu.family)
    for info in reg.plugins:
        if info.error:
            continue
        for op_converter in info.provides.get("converters", []):
            problem = unread_names(op_converter, declared)
            if problem:
                info.error, info.provides = f"plugin {info.label}: {problem}", {}
                if reg.strict:
                    raise PluginError(info.error)
                break
    return reg


def unread_names(op_converter: OpConverter, declared: dict[str, str]) -> str:
    """Why ``op_converter.reads`` names something no NPU declares ("" when every name is)."""
    import difflib

    for name in op_converter.reads:
        if name not in declared:
            close = difflib.get_close_matches(name, sorted(declared), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return (
                f"converter {op_converter.name} reads NPU name {name!r}, which no loaded NPU spec "
                f"declares{hint}; a name nobody sets would read as 'no limit'"
            )
    return ""


def _new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _provide(pm: pluggy.PluginManager, module: object, info: PluginInfo) -> None:
    """Register ``module`` with ``pm`` and fill ``info.provides`` from its hooks.

    The one way a plugin loads, installed or handed to :func:`extra_plugins`: a function named
    like a hook but not marked ``@hookimpl`` (pluggy would skip it: the plugin would provide
    nothing) and a marked function naming no hook are errors naming the plugin."""
    pm.register(module, name=f"{info.distribution}:{info.name}")
    marked = {
        hook for hook in HOOKS if any(i.plugin is module for i in getattr(pm.hook, hook).get_hookimpls())
    }
    for attr in sorted(dir(module)):
        if attr.startswith(f"{hookspecs.PROJECT}_") and callable(getattr(module, attr, None)):
            if attr in HOOKS and attr not in marked:
                raise PluginError(
                    f"plugin {info.label}: {attr}() is not marked @hookimpl (from etforge.sdk import "
                    "hookimpl): pluggy would not call it and the plugin would provide nothing"
                )
            if attr not in HOOKS and _is_hookimpl(getattr(module, attr)):
                raise PluginError(
                    f"plugin {info.label}: {attr}() is marked @hookimpl but no such hook exists "
                    f"(hooks: {', '.join(HOOKS)})"
                )
    for hook in HOOKS:
        impls = [i for i in getattr(pm.hook, hook).get_hookimpls() if i.plugin is module]
        for impl in impls:
            try:
                result = impl.function()
            except Exception as exc:  # a plugin's bug must not take the others down
                raise PluginError(
                    f"plugin {info.label}: hook {hook}() raised {type(exc).__name__}: {exc}"
                ) from exc
            info.provides.setdefault(HOOKS[hook][1], []).extend(_validate(info, hook, result))


def _is_hookimpl(value: object) -> bool:
    return hasattr(value, f"{hookspecs.PROJECT}_impl")


def load_plugins(entry_points: Iterable[md.EntryPoint] | None = None, strict: bool = False) -> Registry:
    """Load every plugin; with ``strict`` the first broken plugin raises :class:`PluginError`."""
    pm = _new_manager()
    infos: list[PluginInfo] = []
    for ep in _entry_points() if entry_points is None else entry_points:
        dist = ep.dist.name if ep.dist else "?"
        version = ep.dist.version if ep.dist else "?"
        info = PluginInfo(name=ep.name, distribution=dist, version=version, entry_point=ep.value)
        infos.append(info)
        try:
            _provide(pm, ep.load(), info)
        except PluginError as exc:
            info.error, info.provides = str(exc), {}
        except Exception as exc:
            info.error, info.provides = (
                f"plugin {info.label}: failed to load: {type(exc).__name__}: {exc}",
                {},
            )
        if info.error and strict:
            raise PluginError(info.error)
    return _checked_names(Registry(infos, strict=strict))


_OVERRIDE: list[Registry] = []
_LOADED: list[Registry] = []  # at most one: the process-wide registry once loaded


def _entry_point_registry() -> Registry:
    if not _LOADED:
        _LOADED.append(load_plugins())
    return _LOADED[0]


def registry() -> Registry:
    """The process-wide registry (entry points do not change while a process runs)."""
    return _OVERRIDE[-1] if _OVERRIDE else _entry_point_registry()


def use_as_default(reg: Registry) -> Registry:
    """Make ``reg`` the process-wide registry when none is loaded yet (the CLI loads once,
    with its ``--strict``, and code that asks ``registry()`` later gets that same one)."""
    if not _LOADED:
        _LOADED.append(reg)
    return _LOADED[0]


@contextmanager
def extra_plugins(*modules: object) -> Iterator[Registry]:
    """Use these plugin modules as if installed (e.g. to test a plugin before packaging it).

    They load the way an installed plugin does (:func:`_provide`), except that a broken one
    raises :class:`PluginError` here rather than being listed by ``etforge plugins``."""
    base = _entry_point_registry()
    infos = list(base.plugins)
    pm = _new_manager()
    for module in modules:
        name = getattr(module, "__name__", type(module).__name__)
        info = PluginInfo(name=name, distribution="(in-process)", version="-", entry_point=name)
        _provide(pm, module, info)
        infos.append(info)
    reg = _checked_names(Registry(infos, strict=base.strict))
    broken = [p for p in reg.plugins[len(base.plugins) :] if p.error]
    if broken:
        raise PluginError(broken[0].error or "")
    _OVERRIDE.append(reg)
    try:
        yield reg
    finally:
        _OVERRIDE.pop()
