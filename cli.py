"""The ``etforge`` command line.

Exit codes: 0 success, 1 the job failed (bad model, plugin error under --strict, parity
above threshold ...), 2 bad usage. Describing commands never import torch. Every failure is
one ``error:`` line naming its culprit; ``--debug`` (or ``ETFORGE_DEBUG=1``) adds the
traceback. Third-party noise is silenced unless ``-v`` (``core.quiet``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import traceback
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from etforge.core.common.errors import EtforgeError, first_line, strip_ansi
from etforge.core.registry.manager import Registry, load_plugins, use_as_default

#: The reader of stdout went away (``etforge compile ... | head -1``).
_PIPE = {"broken": False}
#: Exit code after a broken pipe: 128 + SIGPIPE, what a shell reports for a process the
#: signal stopped (``yes | head -1``); the command itself ran to its end.
BROKEN_PIPE_EXIT = 141


class _Console(Console):
    """A console that survives its reader going away: output stops, the command goes on.

    Rich's default exits at once (code 1), which killed a compile mid-way, its output
    discarded, when ``| head`` closed the pipe; here the rest is dropped and the command
    finishes (``EtforgeGroup`` reports the broken pipe in one line at the end).
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True
        _PIPE["broken"] = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.file.fileno())
            os.close(devnull)


console = _Console(highlight=False)
err_console = _Console(stderr=True, highlight=False)
#: ``--quiet`` / ``--json``: no progress lines, no summary (only errors and the final line).
_OUTPUT = {"quiet": False}
#: ``--debug`` seen (the environment variable works before the options are parsed, too).
_DEBUG = {"on": os.environ.get("ETFORGE_DEBUG", "") not in ("", "0")}


#: Columns of piped output when ``$COLUMNS`` does not say (a terminal's own width wins).
PIPED_WIDTH = 100


def _fit_width() -> None:
    """Piped, rich would assume 80 columns; the output is 100 wide unless ``$COLUMNS`` says."""
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console.width = PIPED_WIDTH


def _print_table(table: Table) -> None:
    """A table as wide as the output; one too wide for it becomes records.

    On a terminal rich fits the table to it. Piped, a table that fits ``console.width`` is
    printed as is; a wider one (long op names, constraints, reasons) is printed one record
    per row — the first cell on its own line, then ``column: value`` lines wrapped at the
    width only between words — so every name stays whole for ``grep`` and no line is
    hundreds of columns wide.
    """
    import io

    if console.is_terminal:
        console.print(table)
        return
    probe = Console(highlight=False, width=100_000, file=io.StringIO())
    probe.print(table)
    if max((len(ln.rstrip()) for ln in probe.file.getvalue().splitlines()), default=0) <= console.width:
        console.print(table)
        return
    console.print(table_records(table, console.width), markup=False, highlight=False, soft_wrap=True)


def table_records(table: Table, width: int) -> str:
    """``table`` as plain-text records at most ``width`` columns wide (bar a single longer word)."""
    import textwrap

    from rich.text import Text

    def plain(cell: Any) -> str:
        return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain

    headers = [plain(c.header) for c in table.columns]
    columns = [[plain(cell) for cell in c.cells] for c in table.columns]
    lines = [plain(table.title)] if table.title else []
    for row in zip(*columns, strict=True):
        if len(row) == 2:  # a key/value table (verify's): one "key: value" record per row
            text = f"{row[0]}: {' '.join(row[1].split())}"
            lines += textwrap.wrap(
                text, width=width, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False
            ) or [text]
            continue
        lines.append(row[0])
        for header, value in zip(headers[1:], row[1:], strict=True):
            parts = [v for v in value.split("\n") if v.strip()]
            if not parts:
                continue
            first = f"    {header}: {parts[0]}" if len(parts) == 1 else f"    {header}:"
            rest = [] if len(parts) == 1 else [f"      {v}" for v in parts]
            for text in [first, *rest]:
                lines += textwrap.wrap(
                    text,
                    width=width,
                    subsequent_indent="        ",
                    break_long_words=False,
                    break_on_hyphens=False,
                ) or [text]
    return "\n".join(lines)


class Ctx:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self._registry: Registry | None = None

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            # Loaded once per run; the pipeline (and anything asking ``registry()``) uses it.
            self._registry = use_as_default(load_plugins(strict=self.strict))
            for p in self._registry.errors:
                _say("warning", str(p.error))
        return self._registry


def _say(kind: str, message: str) -> None:
    """One ``error:``/``warning:`` line on stderr: no markup, no escape codes, never wrapped."""
    colour = "red" if kind == "error" else "yellow"
    err_console.print(f"[{colour}]{kind}:[/] {escape(strip_ansi(message))}", soft_wrap=True)


def _fail(message: str, code: int = 1) -> None:
    if _DEBUG["on"]:
        traceback.print_exc()
    _say("error", message)
    sys.exit(code)


class EtforgeGroup(click.Group):
    """Every failure becomes one ``error:`` line: EtforgeError (exit 1), usage (exit 2), and
    a last-resort line for anything unexpected (exit 1, ``--debug`` for the traceback)."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            if isinstance(exc, click.UsageError) and ctx is not None:
                click.echo(ctx.get_usage(), err=True)
                click.echo(f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.", err=True)
            _fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            _fail("interrupted", 130)
        except EtforgeError as exc:
            _fail(str(exc))
        except BrokenPipeError:  # click.echo (--json) to a closed pipe, after the work is done
            console.on_broken_pipe()
        except Exception as exc:  # a bug (ours or a plugin's): still one line, the traceback on request
            _fail(f"unexpected {type(exc).__name__}: {first_line(exc)} (run with --debug for the traceback)")
        if _PIPE["broken"]:
            _say("warning", "stdout was closed early (broken pipe): the rest of the output was dropped; "
                 "the command itself ran to its end")  # fmt: skip
            sys.exit(BROKEN_PIPE_EXIT)
        sys.exit(rv if isinstance(rv, int) else 0)


def run() -> None:
    """The ``etforge`` command: :func:`main`, then an exit that skips interpreter teardown.

    Tearing down torch's and ExecuTorch's object graphs takes 1-2 s after a compile and
    changes nothing: every output is written, closed and renamed into place before ``main``
    returns. ``atexit`` handlers (worker pools, temporary directories, logging) still run.
    """
    import atexit

    from etforge.core.common import process_memory

    process_memory.tune_collector()
    try:
        main()
        code: int = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@click.group(cls=EtforgeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--strict", is_flag=True, help="Treat a plugin that fails to load as a fatal error.")
@click.option("--debug", is_flag=True, help="Show the Python traceback behind an error.")
@click.option("-v", "--verbose", is_flag=True, help="Show third-party warnings and logs.")
@click.version_option(package_name="etforge")
@click.pass_context
def main(ctx: click.Context, strict: bool, debug: bool, verbose: bool) -> None:
    """etforge: compile PyTorch models for the NXP i.MX RT700 through ExecuTorch."""
    from etforge.core.common import quiet

    _DEBUG["on"] = _DEBUG["on"] or debug
    quiet.install(verbose)  # before any command imports torch
    _fit_width()
    ctx.obj = Ctx(strict)


def _target(reg: Registry, name: str, hint: str = "--target") -> Any:
    """The target named on the command line; an unknown name is a usage error (exit 2)."""
    try:
        return reg.target(name)
    except EtforgeError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _resolved(target: Any, raw: dict[str, str]) -> dict[str, Any]:
    """``--option`` pairs checked against the target; an unknown name or bad value exits 2."""
    from etforge.core.registry.options import resolve_options

    try:
        return resolve_options(target, raw)
    except EtforgeError as exc:
        raise click.BadParameter(str(exc), param_hint="--option") from None


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def plugins(obj: Ctx, as_json: bool) -> None:
    """List the plugins found through the `etforge` entry points and what each provides."""
    reg = obj.registry
    if as_json:
        data = {
            "plugins": [
                {
                    "name": p.name,
                    "distribution": p.distribution,
                    "version": p.version,
                    "entry_point": p.entry_point,
                    "error": p.error,
                    "provides": {k: [_item_name(i) for i in v] for k, v in p.provides.items()},
                }
                for p in reg.plugins
            ],
            "conflicts": [
                {"op": c.op, "target": c.target, "order": [list(o) for o in c.order], "note": c.note}
                for c in reg.conflicts()
            ],
            "rule_conflicts": [
                {"op": c.op, "scheme": c.scheme, "order": [list(o) for o in c.order], "note": c.note}
                for c in reg.rule_conflicts()
            ],
            "warnings": reg.coverage_warnings(),
        }
        click.echo(json.dumps(data, indent=2))
        return
    table = Table(title="etforge plugins")
    for col in ("plugin", "distribution", "version", "provides"):
        table.add_column(col, overflow="fold")
    for p in reg.plugins:
        provides = "[red]FAILED[/]: " + (p.error or "") if p.error else _provides_text(p.provides)
        table.add_row(p.name, p.distribution, p.version, provides)
    _print_table(table)
    conflicts = reg.conflicts()
    if conflicts:
        ct = Table(title="converter conflicts (first is asked first)")
        for col in ("op", "target", "order", "note"):
            ct.add_column(col, overflow="fold")
        for c in conflicts:
            ct.add_row(
                c.op,
                c.target,
                " > ".join(f"{conv} ({plug}, prio {pr})" for plug, conv, pr in c.order),
                c.note,
            )
        _print_table(ct)
    rule_conflicts = reg.rule_conflicts()
    if rule_conflicts:
        rt = Table(title="quantizer-rule conflicts (first annotates the op)")
        for col in ("op", "scheme", "order", "note"):
            rt.add_column(col, overflow="fold")
        for r in rule_conflicts:
            order = " > ".join(f"{kind} ({plug}, prio {pr})" for plug, kind, pr in r.order)
            rt.add_row(r.op, r.scheme, order, r.note)
        _print_table(rt)
    for warning in reg.coverage_warnings():
        err_console.print(f"warning: {warning}", soft_wrap=True, markup=False)


def _item_name(item: object) -> str:
    for attr in ("name",):
        value = getattr(item, attr, None)
        if isinstance(value, str) and value:
            return value
    ops = getattr(item, "ops", None)
    if ops:
        return "rule:" + ",".join(ops)
    return type(item).__name__


def _provides_text(provides: dict[str, list[Any]]) -> str:
    parts = []
    for key, items in provides.items():
        if items:
            names = [_item_name(i) for i in items]
            shown = ", ".join(names[:6]) + (f", … (+{len(names) - 6})" if len(names) > 6 else "")
            parts.append(f"{len(items)} {key.replace('_', ' ')}: {shown}")
    return "\n".join(parts) or "nothing"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def targets(obj: Ctx, as_json: bool) -> None:
    """List the compilation targets."""
    reg = obj.registry
    compilers = reg.npu_compilers
    if as_json:
        click.echo(json.dumps([t.describe() for _, t in sorted(reg.targets.items())], indent=2))
        return
    table = Table(title="etforge targets")
    for col in ("target", "NPU", "CPU fallback", "NPU compiler", "description"):
        table.add_column(col, overflow="fold")
    for name, t in sorted(reg.targets.items()):
        comp = "-"
        if t.npu is not None and t.npu.compiler:
            c = compilers.get(t.npu.compiler)
            comp = f"{t.npu.compiler}: " + ((c.available()[1]) if c else "[red]no such compiler plugin[/]")
        npu = "-" if t.npu is None else _npu_text(t.npu)
        table.add_row(name, npu, f"{t.cpu_fallback} ({t.cpu})", comp, t.description)
    _print_table(table)
    for name, t in sorted(reg.targets.items()):
        for fig, info in (t.npu.figures() if t.npu is not None else {}).items():
            if info["assumption"]:
                console.print(
                    f"[yellow]{name}: {fig}={info['value']} is an assumption[/] ({t.npu.assumptions[fig]})"
                )


def _npu_text(npu: Any) -> str:
    """NPU family, dtypes and its device figures, each marked as an assumption or read from the SDK."""
    figs = [
        f"{k}={v['value']} ({'assumption' if v['assumption'] else 'from the SDK'})"
        for k, v in npu.figures().items()
    ]
    return f"{npu.family}, {'/'.join(npu.dtypes)}" + (f"; {', '.join(figs)}" if figs else "")


@main.command()
@click.option("--target", "-t", "target_name", required=True, help="Target name (see `etforge targets`).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def ops(obj: Ctx, target_name: str, as_json: bool) -> None:
    """The NPU support matrix of a target: op, converter, plugin, dtypes, constraints."""
    reg = obj.registry
    target = _target(reg, target_name)
    rows = []
    for op, cands in sorted(reg.converters_for(target).items()):
        for rank, conv in enumerate(cands):
            d = conv.describe()
            # What the target runs: the converter's dtypes the NPU executes (Neutron: int8 only).
            runs = [x for x in d["dtypes"] if target.npu is None or x in target.npu.dtypes]
            row = {"op": op, "rank": rank, "plugin": reg.owner(conv), **d}
            rows.append({**row, "dtypes": runs, "converter_dtypes": d["dtypes"]})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if target.npu is None:
        console.print(f"target {target.name!r} has no NPU: every op runs on the CPU ({target.cpu_fallback}).")
        return
    table = Table(title=f"NPU support on {target.name} ({target.npu.family})")
    for col in ("op", "converter", "plugin", "dtypes", "constraints"):
        table.add_column(col, overflow="fold")
    for r in rows:
        name = r["name"] if r["rank"] == 0 else f"{r['name']} (fallback {r['rank']})"
        table.add_row(r["op"], name, r["plugin"], ",".join(r["dtypes"]), "\n".join(r["constraints"]))
    _print_table(table)


def _parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--option")
        key, value = pair.split("=", 1)
        out[key.strip()] = value.strip()
    return out


@main.command(name="compile")
@click.argument("models", nargs=-1, metavar="MODEL...")
@click.option(
    "--target",
    "-t",
    "target_name",
    default="imxrt700cm",
    show_default=True,
    help="Target (see `etforge targets`).",
)
@click.option(
    "-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory."
)
@click.option(
    "--calib", "calib", type=click.Path(), help="Calibration data: a .pt file with a list of input tuples."
)
@click.option("--float", "float_", is_flag=True, help="Do not quantize (float32).")
@click.option(
    "--option", "raw_options", multiple=True, metavar="KEY=VALUE", help="Target option (repeatable)."
)
@click.option(
    "--etrecord", is_flag=True, help="Also write OUT/model.etrecord for ExecuTorch's devtools Inspector."
)
@click.option(
    "--memory-budget",
    type=click.IntRange(min=1),
    default=None,
    metavar="BYTES",
    help="Fail if the planned arena, or the arena beside an NPU partition's working memory, is larger.",
)
@click.option("--no-cache", is_flag=True, help="Compile afresh; neither read nor fill the build cache.")
@click.option(
    "--no-fallback",
    is_flag=True,
    help="Fail, writing nothing, where the compile would take a second-best path (report.json 'fallbacks').",
)
@click.option("--quiet", "-q", is_flag=True, help="Print only errors, warnings and the final line.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (nothing else on stdout).")
@click.option(
    "--manifest",
    type=click.Path(dir_okay=False),
    help="Compile the models × targets × options a JSON/TOML manifest lists (docs/batch.md).",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Parallel compiles (default: one per core).",
)
@click.option(
    "--ray", "ray_address", metavar="ADDRESS", help="Run the jobs on a Ray cluster ('local': start one)."
)
@click.pass_obj
def compile_cmd(
    obj: Ctx,
    models: tuple[str, ...],
    target_name: str,
    out_dir: str,
    calib: str | None,
    float_: bool,
    raw_options: tuple[str, ...],
    etrecord: bool,
    memory_budget: int | None,
    no_cache: bool,
    no_fallback: bool,
    quiet: bool,
    as_json: bool,
    manifest: str | None,
    jobs: int | None,
    ray_address: str | None,
) -> None:
    """Compile MODEL (zoo:NAME, path/file.py:factory or a .pt2 file) into OUT/model.pte.

    Several models, or --manifest, compile in parallel into OUT/<model>/<target>/.
    """
    from pathlib import Path

    _OUTPUT["quiet"] = quiet or as_json
    if manifest or len(models) > 1 or ray_address:
        if etrecord or memory_budget or as_json or no_fallback:
            raise click.UsageError(
                "--etrecord, --memory-budget, --no-fallback and --json go with a single model"
            )
        _compile_many(
            obj, models, manifest, target_name, Path(out_dir), calib, float_, raw_options, jobs, ray_address
        )
        return
    if not models:
        raise click.UsageError("give a MODEL (or several, or --manifest FILE)")
    if jobs is not None:
        raise click.UsageError("--jobs goes with several models or --manifest")
    model = models[0]
    from etforge.core.build import output
    from etforge.core.cache import store as cache

    out = Path(out_dir)
    reg = obj.registry
    target = _target(reg, target_name)
    options = _resolved(target, _parse_options(raw_options))
    staging = output.prepare(out)  # OUT must be replaceable before anything is compiled
    output.kill_point("staging")
    use_cache = cache.enabled() and not no_cache
    try:
        try:
            job = _Job(
                staging,
                reg,
                model,
                target,
                options,
                calib,
                float_,
                etrecord,
                memory_budget,
                use_cache,
                no_fallback,
            )
            generated, report, cached = _compile_into(job)
            output.commit(staging, out)
        except OSError as exc:  # a full disk, a quota, a file system gone read-only
            raise output.write_error(out, exc) from None
    except BaseException:
        output.discard(staging)  # OUT keeps the previous complete output, if any
        raise
    info = report.get("cache") or {}
    if as_json:
        from etforge.core.build.summary import summary_data

        click.echo(json.dumps({**summary_data(report, str(out)), "cached": cached}, indent=2))
        _missing_kernels(generated)
        return
    if quiet:
        from etforge.core.build.summary import final_line

        console.print(escape(final_line(report, str(out))), soft_wrap=True)
        _missing_kernels(generated)
        return
    if cached:
        console.print("[green]✓[/] restored from the build cache (nothing changed since it was built)")
    console.print(
        f"cache: {info.get('mode', 'miss')} ({escape(str(info.get('reason', '')))})", soft_wrap=True
    )
    _print_summary(report, out, generated)


@dataclasses.dataclass(frozen=True)
class _Job:
    """One model's compile, as the command line asked for it (into ``staging``)."""

    staging: Any
    reg: Registry
    model: str
    target: Any
    options: dict[str, Any]
    calib: str | None
    float_: bool
    etrecord: bool
    memory_budget: int | None
    use_cache: bool = False
    no_fallback: bool = False

    @property
    def flags(self) -> dict[str, Any]:
        """The command-line flags that change the build (part of the cache key)."""
        return {
            "float": self.float_,
            "etrecord": self.etrecord,
            "budget": self.memory_budget,
            "no_fallback": self.no_fallback,
        }


def _compile_into(job: _Job) -> tuple[Any, dict[str, Any], bool]:
    """The whole compile, written into ``staging`` (swapped in as OUT by the caller).

    Returns (codegen result, report, restored from the cache). The cache is asked twice:
    first in direct mode (``core.direct_cache``: what the user typed and the files the model
    read last time, before torch is imported), then with the full key after the front end
    (torch, the model, ``torch.export``); ExecuTorch, torchao and LiteRT are imported only
    when the build has to run.
    """
    from etforge.core.build import output

    staging, reg, model, target, options, calib = (job.staging, job.reg, job.model, job.target, job.options, job.calib)  # fmt: skip
    float_, use_cache, flags = job.float_, job.use_cache, job.flags
    direct = None
    if use_cache:
        from etforge.core.cache import store as cache
        from etforge.core.cache.direct import Session

        direct = Session.open(
            model=model, target=target, options=options, flags=flags, calib=calib, reg=reg, exclude=[staging]
        )
        if direct is not None and direct.restore(staging):
            try:
                report = output.load_report(staging / output.REPORT)
                problem = cache.check_report(report, model=model, target=target.name, quantized=not float_)
                if problem is None:
                    return None, _cache_info(staging, report, "direct", direct.why), True
                direct.why = f"the cached build was not trusted: {problem}"
            except EtforgeError as exc:
                direct.why = f"the cached build was not trusted: {exc}"
            _say("warning", f"{direct.why}; rebuilding")
            direct.distrust(staging)  # never trusted: the entry goes, the normal path rebuilds
    recording = direct.recorder.recording() if direct is not None else contextlib.nullcontext()
    from etforge.core.common import fallbacks

    with fallbacks.recording(job.no_fallback):  # the front end's and the compile's
        generated, report, cached, key = _build_into(job, recording)
    if not use_cache:
        return generated, _cache_info(staging, report, "miss", "the build cache is off"), cached
    if direct is not None and key is not None:
        direct.save(key)
    direct_why = direct.why if direct is not None else "direct mode unavailable for this command line"
    if cached:
        reason = f"the exported program and everything the build depends on are unchanged ({direct_why})"
        return generated, _cache_info(staging, report, "exported", reason), cached
    reason = f"no cached build of this exported program; {direct_why}"
    return generated, _cache_info(staging, report, "miss", reason), cached


def _cache_info(staging: Any, report: dict[str, Any], mode: str, reason: str) -> dict[str, Any]:
    """``report["cache"]``: how the build cache answered (direct, exported or miss) and why;
    written into the staged report.json (the cached entry keeps the report as built)."""
    import json

    from etforge.core.build import output

    report["cache"] = {"mode": mode, "reason": reason}
    path = staging / output.REPORT
    if path.is_file():
        path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    return report


def _build_into(
    job: _Job,
    recording: contextlib.AbstractContextManager[Any],
) -> tuple[Any, dict[str, Any], bool, str | None]:
    """The front end, the full-key cache lookup and, on a miss, the build; also returns the
    full key when the cache holds the output (None when the cache is off or not updated).

    ``recording`` spans what runs the user's code and reads the user's files (loading,
    building, exporting the model, reading calibration data): direct mode's dependencies."""
    from etforge.core.build import output

    staging, reg, model, target, options, calib = (job.staging, job.reg, job.model, job.target, job.options, job.calib)  # fmt: skip
    float_, etrecord, memory_budget, use_cache, flags = (
        job.float_, job.etrecord, job.memory_budget, job.use_cache, job.flags,
    )  # fmt: skip

    with _progress("import"):
        import torch  # noqa: F401  (its import time is this stage)

        from etforge.core.front.export import front_end
        from etforge.core.front.load import load_calibration, load_model
    with recording:
        with _progress("load"):
            loaded = load_model(model)
            calibration = loaded.calibration
            if calib:
                calibration = load_calibration(calib, loaded.example_inputs)
        with _progress("export"):
            front = front_end(
                loaded.module,
                loaded.example_inputs,
                calibration,
                target,
                options,
                reg,
                loaded.program,
                model,
                owned=True,  # loaded for this compile alone: converted in place, not copied
            )
    key = None
    if use_cache:
        from etforge.core.cache import store as cache

        key = cache.compile_key(front, reg, model, target, options, flags)
        build_cache = cache.BuildCache()
        if build_cache.restore(key, staging):
            try:
                restored = output.load_report(staging / output.REPORT)
                problem = cache.check_report(restored, model=model, target=target.name, quantized=not float_)
            except EtforgeError as exc:
                problem = str(exc)
            if problem is None:
                return None, restored, True, key
            _say("warning", f"the cached build {key[:12]} was not trusted: {problem}; rebuilding")
            build_cache.discard(key)
            from etforge.core.cache.direct import Session

            Session.restore_failed(staging)
        elif build_cache.why.startswith("the cached entry"):
            _say("warning", f"{build_cache.why}; rebuilding")
    with _progress("import executorch"):
        from etforge.core.common.lazy_imports import defer_inductor_post_grad

        defer_inductor_post_grad()
        from etforge.core.build.compiler import compile_model
        from etforge.core.build.report import build_report
        from etforge.core.serialize.program_writer import ProgramWriter
    # float.pt2 / quantized.pt2 are written by a child process while this one lowers.
    with ProgramWriter(staging, (output.FLOAT_PROGRAM, output.QUANTIZED_PROGRAM)) as writer:
        result = compile_model(
            loaded.module,
            loaded.example_inputs,
            target,
            calibration=calibration,
            options=options,
            quantize=not float_,
            program=loaded.program,
            reg=reg,
            progress=_progress,
            what=model,
            front=front,
            on_programs=writer.start,  # strict or not: the recording _compile_into opened
        )
        result.notes[:0] = loaded.notes  # e.g. a dynamic batch fixed to the example's size
        from etforge.core.serialize.memory import check_budget, memory_stats
        from etforge.core.serialize.npu_memory import plan_result

        check_budget(memory_stats(result.executorch), memory_budget, plan_result(result))
        with _progress("write"):
            writer.finish()
            report = build_report(result, reg, model)
            output.write_outputs(staging, result, report, programs=False)
    if etrecord:
        with _progress("etrecord"):
            output.write_etrecord(staging, result)
    with _progress("codegen"):
        from etforge.codegen import generate

        generated = generate(staging / output.PTE, staging / output.CODEGEN, report=report)
    if key is not None:
        from etforge.core.cache import store as cache

        try:
            cache.BuildCache().store(key, staging)
        except cache.CacheError as exc:  # a full or read-only cache never fails the compile
            _say("warning", str(exc))
            key = None
    return generated, report, False, key


def _compile_many(
    obj: Ctx,
    models: tuple[str, ...],
    manifest: str | None,
    target_name: str,
    out: Any,
    calib: str | None,
    float_: bool,
    raw_options: tuple[str, ...],
    jobs: int | None,
    ray_address: str | None,
) -> None:
    """Models × targets × options in parallel child compiles; a summary table; exit 1 if any failed."""
    from pathlib import Path

    from etforge.core.batch import run as batch
    from etforge.core.cache import store as cache

    if manifest:
        if models:
            raise click.UsageError("give models on the command line or --manifest, not both")
        plan = batch.load_manifest(Path(manifest), out)
    else:
        opts = _parse_options(raw_options)
        _resolved(_target(obj.registry, target_name), opts)  # a bad option fails before any job runs
        plan = batch.plan(list(models), [target_name], [opts], out, float_=float_, calib=calib)
    for target in sorted({j.target for j in plan}):
        _target(obj.registry, target, "manifest")  # an unknown target fails before any job runs
    where = f"Ray at {ray_address}" if ray_address else f"{jobs or os.cpu_count() or 1} local workers"
    quiet = _OUTPUT["quiet"]
    if not quiet:
        console.print(f"compiling {len(plan)} jobs on {where} ...")

    def done(r: batch.JobResult) -> None:
        if quiet:
            return
        mark = "[green]✓[/]" if r.ok else "[red]✗[/]"
        console.print(f"{mark} {escape(r.job.model)} → {r.job.target} {r.seconds:6.1f} s", soft_wrap=True)

    if ray_address:
        results = batch.run_ray(plan, ray_address, str(cache.default_dir()), on_done=done)
    else:
        results = batch.run_local(plan, jobs, on_done=done)
    table = Table(title=f"{sum(r.ok for r in results)} of {len(results)} compiled")
    for col in ("model", "target", "result", "time", "partitions", "NPU MACs", "note"):
        table.add_column(col, overflow="fold")
    for row in batch.summary_rows(results):
        table.add_row(*(escape(c) for c in row))
    if quiet:
        for r in results:
            if not r.ok:
                _say("error", f"{r.job.model} → {r.job.target}: {r.message}")
    else:
        _print_table(table)
    console.print(f"{sum(r.ok for r in results)} of {len(results)} compiled into {out}")
    if not all(r.ok for r in results):
        sys.exit(1)


def _progress(stage: str) -> Any:
    """A spinner while ``stage`` runs (on a terminal), then one line with its time."""
    import contextlib
    import time

    @contextlib.contextmanager
    def run() -> Any:
        start = time.perf_counter()
        if _OUTPUT["quiet"]:
            yield
        else:
            with console.status(f"{stage} ..."):
                yield
            console.print(f"[green]✓[/] {stage:<10} {time.perf_counter() - start:6.2f} s")
        from etforge.core.common import process_memory

        if stage.startswith("import") or stage == "export":  # export imports torch._dynamo
            process_memory.settle()
        process_memory.release()

    return run()


def _print_summary(report: dict[str, Any], out: Any = None, generated: Any = None) -> None:
    """The one-screen summary (``core.summary``); the per-node table is ``report --ops``."""
    from etforge.core.build.summary import summary_lines

    for line in summary_lines(report, str(out) if out is not None else None, width=min(console.width, 100)):
        console.print(escape(line), soft_wrap=True)
    _missing_kernels(generated)


def _missing_kernels(generated: Any) -> None:
    if generated is not None and generated.missing:
        _say("warning", f"no kernel library provides: {', '.join(generated.missing)}")


@main.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option(
    "--ops", "by_op", is_flag=True, help="Per Edge node: placement, LiteRT ops / Cortex-M op, MACs."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the placement picture: the graph, each node coloured by where it runs (opens offline).",
)
@click.option(
    "--model-explorer",
    "me_dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Write the same overlay as Model Explorer node data for model.pte and each partition .tflite.",
)
def report(out_dir: str, by_op: bool, as_json: bool, html_file: str | None, me_dir: str | None) -> None:
    """Show the report of a compile in OUT."""
    from pathlib import Path

    from etforge.core.build import output

    output.recover(Path(out_dir))  # a swap cut short by a kill is finished first
    data = output.load_report(Path(out_dir) / output.REPORT)
    if html_file or me_dir:
        _write_pictures(Path(out_dir), data, html_file, me_dir)
        return
    if not by_op:
        if as_json:
            click.echo(json.dumps(data, indent=2))
        else:
            _print_summary(data)
        return
    rows = []
    for n in data["nodes"]:
        if n["placement"] == "npu":
            ran_as = (
                ", ".join(f"{o['partition']}#{o['index']} {o['op']}" for o in n["litert_ops"]) or "(folded)"
            )
        else:
            ran_as = n["cpu_op"] or "-"
        who = f"{n['converter']} ({n['plugin']})" if n.get("converter") else "-"
        rows.append({"node": n["node"], "op": n["op"], "placement": n["placement"], "runs_as": ran_as, "macs": n["macs"],
                     "debug_handle": n["debug_handle"], "decided_by": who, "reason": n.get("reason") or ""})  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{data['model']} on {data['target']}: Edge node -> what runs it")
    for col in ("node", "op", "placement", "LiteRT ops / CPU op", "decided by", "MACs", "reason"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["node"], r["op"], r["placement"], r["runs_as"], r["decided_by"], f"{r['macs']:,}", r["reason"]
        )
    _print_table(table)


def _write_pictures(out: Any, data: dict[str, Any], html_file: str | None, me_dir: str | None) -> None:
    """``report --html`` / ``--model-explorer``: each file written whole, then renamed into place."""
    from pathlib import Path

    if any("inputs" not in n for n in data.get("nodes", [])):
        raise EtforgeError(f"{out}: its report.json has no graph edges (an older etforge); recompile it")
    if html_file:
        from etforge.codegen.placement_html import render

        path = Path(html_file)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(render(data), encoding="utf-8")
            tmp.replace(path)
        except OSError as exc:
            raise EtforgeError(f"{path}: cannot write the picture: {exc.strerror or exc}") from None
        console.print(f"wrote {escape(str(path))} ({len(data.get('nodes', []))} nodes)", soft_wrap=True)
    if me_dir:
        from etforge.codegen.model_explorer import write

        try:
            files = write(out, data, Path(me_dir))
        except OSError as exc:
            raise EtforgeError(f"{me_dir}: cannot write the node data: {exc.strerror or exc}") from None
        console.print(
            f"wrote Model Explorer node data: {', '.join(escape(str(f)) for f in files)}", soft_wrap=True
        )


def _print_codegen(result: Any, gen_dir: Any) -> None:
    libs = ", ".join(f"{lib} {n}/{total}" for lib, (n, total) in result.per_library.items() if n)
    console.print(
        f"codegen: {len(result.registered)} operator(s) registered ({libs or 'none'} of a full build) -> {gen_dir}"
    )
    if result.missing:
        _say("warning", f"no kernel library provides: {', '.join(result.missing)}")


@main.command()
@click.argument("pte", type=click.Path(dir_okay=False))
@click.option(
    "-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Where to write."
)
@click.option("--prefix", default="", help="Prefix for file names and C++ symbols.")
@click.option(
    "--namespace", default="etforge_model", show_default=True, help="C++ namespace of the generated code."
)
@click.option(
    "--report", "report_path", type=click.Path(dir_okay=False), help="report.json (default: next to PTE)."
)
@click.option(
    "--allow-missing", is_flag=True, help="Generate even when a used operator has no known kernel library."
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if regenerating would change the files.")
@click.option(
    "--libraries",
    default=None,
    metavar="L1,L2",
    help="Only these kernel libraries provide kernels (e.g. cortex_m,quantized,portable); default: all.",
)
@click.pass_obj
def codegen(
    obj: Ctx,
    pte: str,
    out_dir: str,
    prefix: str,
    namespace: str,
    report_path: str | None,
    allow_missing: bool,
    check: bool,
    libraries: str | None,
) -> None:
    """Generate the firmware sources for PTE: kernel registration, selective-build yaml, header, CMake."""
    from pathlib import Path

    from etforge.codegen import generate
    from etforge.core.build import output

    chosen = None
    if libraries is not None:
        from etforge.codegen.kernels import library_sizes

        chosen = tuple(x.strip() for x in libraries.split(",") if x.strip())
        unknown = sorted(set(chosen) - set(library_sizes()))
        if unknown or not chosen:
            raise click.BadParameter(
                f"unknown kernel libraries {', '.join(unknown) or '(none given)'}; known: "
                f"{', '.join(sorted(library_sizes()))}",
                param_hint="--libraries",
            )
    beside = Path(pte).parent / output.REPORT
    if report_path:
        report = output.load_report(Path(report_path))
    else:  # generate() would read it unchecked
        report = output.load_report(beside) if beside.is_file() else None
    result = generate(
        Path(pte),
        Path(out_dir),
        prefix=prefix,
        namespace=namespace,
        report=report,
        allow_missing=allow_missing,
        check=check,
        libraries=chosen,
    )
    if check:
        if result.changed:
            err_console.print(f"[red]out of date:[/] {', '.join(result.changed)} in {out_dir}")
            sys.exit(1)
        console.print(f"{out_dir} is up to date")
        return
    _print_codegen(result, out_dir)


def _finite(value: float | None, param: Any, low: float, high: float | None = None) -> float | None:
    """A number option that must be finite and in range (click's FloatRange lets nan through)."""
    import math

    if value is None:
        return None
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        span = f"{low:g} to {high:g}" if high is not None else f"at least {low:g}"
        raise click.BadParameter(f"{value!r} is not a finite number {span}", param=param)
    return value


def _firmware_source_options(f: Any) -> Any:
    """--executorch-src / --cmsis-nn-src: the sources a firmware image is built from."""
    f = click.option(
        "--cmsis-nn-src",
        default=None,
        metavar="DIR",
        help="CMSIS-NN source tree (default: $ETFORGE_CMSIS_NN_SRC, else ../shared/third_party/cmsis-nn).",
    )(f)
    return click.option(
        "--executorch-src",
        default=None,
        metavar="DIR",
        help="ExecuTorch source tree (default: $ETFORGE_EXECUTORCH_SRC, else ../shared/third_party/executorch).",
    )(f)


def _verify_on_device(
    out: Any, runtime: str, samples: int, seed: int, et_src: str | None, nn_src: str | None, as_json: bool
) -> None:
    import dataclasses

    from etforge.runtime.firmware import device, summary

    with console.status(f"building the firmware image and running {out} on {runtime} ..."):
        v = device.verify(
            out, runtime, samples=samples, seed=seed, executorch_src=et_src, cmsis_nn_src=nn_src
        )
    if as_json:
        click.echo(json.dumps({**dataclasses.asdict(v), "ok": v.ok}, indent=2, default=str))
        sys.exit(0 if v.ok else 1)
    for line in summary.verification_lines(v):
        console.print(escape(line), soft_wrap=True)
    if not v.ok:
        for f in v.failures:
            err_console.print(f"[red]FAIL:[/] {escape(f)}", soft_wrap=True)
        sys.exit(1)
    console.print(f"[green]verify passed on {runtime}[/]")


@main.command(name="run")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option(
    "--on", "runtime", type=click.Choice(["qemu-m33"]), required=True, help="The device runtime to run on."
)
@click.option("--samples", default=4, show_default=True, help="Seeded random inputs (as verify draws them).")
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--inputs",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help=".npz with one array per program input (its shape, or with a leading sample dimension).",
)
@click.option(
    "--save", default=None, metavar="FILE", help="Write the outputs to FILE (.npz, out<j>[sample, ...])."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_firmware_source_options
def run_cmd(
    out_dir: str,
    runtime: str,
    samples: int,
    seed: int,
    inputs: str | None,
    save: str | None,
    as_json: bool,
    executorch_src: str | None,
    cmsis_nn_src: str | None,
) -> None:
    """Build (once, cached) a firmware image of OUT's program and run it on an emulated device."""
    from pathlib import Path

    from etforge.runtime.firmware import device, summary

    if save is not None and not save.endswith(".npz"):
        raise click.UsageError(f"--save {save}: outputs are written as a .npz file")
    with console.status(f"building the firmware image and running {out_dir} on {runtime} ..."):
        dev = device.run(
            Path(out_dir), runtime, samples=samples, inputs=Path(inputs) if inputs else None, seed=seed,
            executorch_src=executorch_src, cmsis_nn_src=cmsis_nn_src,
        )  # fmt: skip
    if save is not None:
        summary.save_outputs(dev, Path(save))
    if as_json:
        click.echo(json.dumps(summary.run_json(dev), indent=2))
        return
    for line in summary.run_lines(dev):
        console.print(escape(line), soft_wrap=True)
    if save is not None:
        console.print(f"wrote {save}")


@main.command()
@click.argument("out_dir", metavar="OUT|PTE", type=click.Path())
@click.option(
    "--model",
    "script_model",
    default=None,
    metavar="MODEL",
    help="Verify PTE, a .pte your own script produced: MODEL (zoo:NAME, file.py:factory, .pt2) is the "
    "model it was built from (with --target, --option, --calib or --quantized).",
)
@click.option("--target", "-t", "script_target", default=None, help="With --model: the target PTE is for.")
@click.option(
    "--option", "script_options", multiple=True, metavar="KEY=VALUE", help="With --model: target option."
)
@click.option(
    "--calib", "script_calib", default=None, help="With --model: the calibration data the script used."
)
@click.option(
    "--quantized",
    "script_quantized",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="Q.pt2",
    help="With --model: the script's quantized program (torch.export.save); the reference is lowered from it.",
)
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Seeded random inputs to compare on.",
)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--max-steps",
    type=float,
    default=None,
    callback=lambda ctx, param, v: _finite(v, param, low=0.0),
    help="Also fail when the int8 output is more than S steps from the quantized reference's exact "
    "value (default: reported, not gated). Every NPU op is always held to 1 step from the reference op "
    "on the same inputs, with at most 0.1% of its values one step off.",
)
@click.option(
    "--data",
    default=None,
    metavar="FILE",
    help="Labeled samples: a .npz with arrays x and y, a .pt of tensors x and y, or zoo:NAME (a trained "
    "zoo model's test split); reports float and compiled accuracy and fails on a larger drop.",
)
@click.option(
    "--max-accuracy-drop",
    type=float,
    callback=lambda ctx, param, v: _finite(v, param, low=0.0, high=100.0),
    default=1.0,
    show_default=True,
    metavar="POINTS",
    help="With --data: percentage points of accuracy the compiled program may lose.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every field, per op).")
@click.option("--quiet", "-q", is_flag=True, help="Print only the failures and the final line.")
@click.option(
    "--kernels",
    type=click.Choice(["default", "reference"]),
    default="default",
    show_default=True,
    help="LiteRT kernels for the NPU partitions: default (float-rounded requantization, as the "
    "PT2E reference) or reference (fixed-point, as TFLite Micro / CMSIS-NN).",
)
@click.option(
    "--min-top1",
    type=click.IntRange(min=0),
    default=None,
    help="Required top-1 agreements (default: 31 of every 32 samples).",
)
@click.option(
    "--runtime",
    type=click.Choice(["host", "qemu-m33"]),
    default="host",
    show_default=True,
    help="qemu-m33: run model.pte in ExecuTorch's C++ runtime with CMSIS-NN on an emulated Cortex-M33 "
    "and require its outputs to equal the host interpreter's bit for bit (docs/firmware.md).",
)
@_firmware_source_options
@click.pass_obj
def verify(
    obj: Ctx,
    out_dir: str,
    samples: int,
    seed: int,
    max_steps: float | None,
    min_top1: int | None,
    kernels: str,
    data: str | None,
    max_accuracy_drop: float,
    as_json: bool,
    quiet: bool,
    script_model: str | None,
    script_target: str | None,
    script_options: tuple[str, ...],
    script_calib: str | None,
    script_quantized: str | None,
    runtime: str = "host",
    executorch_src: str | None = None,
    cmsis_nn_src: str | None = None,
) -> None:
    """Run OUT's program on the host (NPU partitions in LiteRT) and compare with torch.

    PTE --model MODEL --target T: verify a .pte your own ExecuTorch script produced.
    """
    from pathlib import Path

    if runtime != "host":
        if script_model is not None:
            raise click.UsageError("--runtime qemu-m33 verifies an OUT directory, not a script's .pte")
        _verify_on_device(Path(out_dir), runtime, samples, seed, executorch_src, cmsis_nn_src, as_json)
        return
    reg = obj.registry
    script: dict[str, Any] | None = None
    if script_model is not None:
        if not script_target:
            raise click.UsageError("--model needs --target: the target the .pte was built for")
        if not out_dir.endswith(".pte"):
            raise click.BadParameter(f"{out_dir!r} is not a .pte file", param_hint="PTE")
        spec = _target(reg, script_target)
        script = {
            "model": script_model,
            "target": spec.name,
            "options": _resolved(spec, _parse_options(script_options)),
            "calib": script_calib,
            "quantized": script_quantized,
        }
    elif script_target or script_options or script_calib or script_quantized:
        raise click.UsageError("--target, --option, --calib and --quantized go with --model")
    elif out_dir.endswith(".pte"):
        raise click.UsageError(f"{out_dir} is a .pte: say which model it was built from (--model, --target)")
    with (
        console.status("rebuilding and running the program on the host ...")
        if not quiet
        else contextlib.nullcontext()
    ):
        from etforge.runtime.verify import verify as run_verify

        checks = {
            "samples": samples, "seed": seed, "max_steps": max_steps, "min_top1": min_top1,
            "kernels": kernels, "data": data, "max_accuracy_drop": max_accuracy_drop,
        }  # fmt: skip
        if script is not None:
            from etforge.runtime.script_pte import verify_script_pte

            v = verify_script_pte(Path(out_dir), **script, **checks)
        else:
            v = run_verify(Path(out_dir), **checks)
    if as_json:
        import dataclasses

        click.echo(json.dumps({**dataclasses.asdict(v), "ok": v.ok}, indent=2, default=str))
        sys.exit(0 if v.ok else 1)
    if quiet:
        for f in v.failures:
            err_console.print(f"[red]FAIL:[/] {escape(f)}", soft_wrap=True)
        console.print(
            "[green]verify passed[/]" if v.ok else f"[red]verify failed[/] ({len(v.failures)} check(s))"
        )
        sys.exit(0 if v.ok else 1)
    table = Table(title=f"verify {out_dir} ({v.samples} seeded inputs, LiteRT {kernels} kernels)")
    table.add_column("metric")
    table.add_column("value")
    if v.max_steps is not None:
        table.add_row("max |ours - quantized ref| (steps)", f"{v.max_steps:.2f}")
        table.add_row("mean |ours - quantized ref| (steps)", f"{v.mean_steps:.4f}")
    if v.top1_vs_quantized is not None:
        table.add_row("top-1 agreement vs quantized ref", f"{v.top1_vs_quantized}/{v.samples}")
        if v.top1_vs_exact is not None:
            table.add_row(
                "top-1 agreement vs quantized ref in float64",
                f"{v.top1_vs_exact}/{v.samples} (required {v.top1_required}/{v.samples})",
            )
        table.add_row("top-1 agreement vs float model", f"{v.top1_vs_float}/{v.samples}")
    if v.op_max_steps is not None:
        table.add_row(
            "NPU ops vs reference op, same inputs",
            f"max {v.op_max_steps} step(s); {v.op_values_off:,} of {v.op_values:,} values off "
            f"({v.op_off_by_one:,} by one step)",
        )
        npu_ops = [o for o in v.ops if o["partition"] != "cpu"]
        top = max(npu_ops, key=lambda o: (o["off_by_one"] / max(o["values"], 1), o["off_by_one"]))
        table.add_row(
            "NPU op with the most values one step off",
            f"{top['partition']}:{top['node']}: {top['off_by_one']:,} of {top['values']:,} (per op: --json)",
        )
    if v.cpu_op_max_steps is not None:
        table.add_row(
            "CPU ops vs reference op, same inputs",
            f"max {v.cpu_op_max_steps} step(s); {v.cpu_values_off:,} of {v.cpu_values:,} values off",
        )
    if v.exact_values:
        table.add_row(
            "NPU values vs device-exact reference", f"{v.exact_values_off:,} of {v.exact_values:,} off"
        )
    unruled = [f"{o.get('partition', 'npu')}:{o['node']}" for o in v.not_exact]
    unruled += [f"cpu:{o['node']}" for o in v.cpu_not_exact]
    if v.op_max_steps is not None or v.cpu_op_max_steps is not None:
        table.add_row(
            "ops without a device-exact rule (compared with torch)",
            ", ".join(unruled[:4]) + (f" +{len(unruled) - 4} more (--json)" if len(unruled) > 4 else "")
            if unruled
            else "none",
        )
    if v.sim_max_steps is not None:
        table.add_row(
            "whole output vs device simulation (every value)",
            "equal" if v.sim_exact else f"max {v.sim_max_steps:g} step(s)",
        )
    if v.float_max_rel is not None:
        table.add_row(
            "NPU ops in float vs float Edge ops (relative)", f"max {v.float_max_rel:.2g} ({v.float_ops} ops)"
        )
    if v.reference_spread_steps is not None:
        table.add_row(
            "quantized ref in float32 vs float64 (its own precision)",
            f"max {v.reference_spread_steps:.2f} steps; top-1 {v.reference_spread_top1}/{v.samples}",
        )
        table.add_row("max |ours - quantized ref in float64| (steps)", f"{v.max_steps_vs_exact:.2f}")
    table.add_row(
        "values the per-op check could not compare",
        f"{v.skipped_values:,}"
        + "".join(f"; {e['partition']}:{e['node']} {e['values']:,} ({e['reason']})" for e in v.skipped[:3])
        + (f"; +{len(v.skipped) - 3} more (--json)" if len(v.skipped) > 3 else ""),
    )
    if v.float_accuracy is not None:
        table.add_row(
            f"accuracy on {v.data} ({v.data_samples} samples)",
            f"float {v.float_accuracy:.2f}% · compiled {v.compiled_accuracy:.2f}% · drop "
            f"{v.accuracy_drop:.2f} points (max {v.max_accuracy_drop:g})",
        )
    if v.pte is not None:
        table.add_row(
            "model.pte (host interpreter) vs Edge program",
            f"{v.pte.agreed}/{v.pte.samples} samples identical"
            + ("" if v.pte.ok else f" (max |diff| {v.pte.max_abs_diff:.4g})")
            + f"; {v.pte.seconds_per_sample * 1000:.0f} ms/sample",
        )
    table.add_row("max |ours - float|", f"{v.max_abs_vs_float:.4g}")
    table.add_row("whole model on the NPU", "yes" if v.whole_model_on_npu else "no")
    if len(v.outputs) > 1 or any(o["kind"] != "float" for o in v.outputs):  # runtime.outputs
        table.add_row(
            "outputs: compared as, samples agreeing",
            "\n".join(f"{o['name']}: {o['compared_as']}, {o['agreed']}/{o['samples']}" for o in v.outputs),
        )
    _print_table(table)
    for note in v.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if not v.ok:
        for f in v.failures:
            err_console.print(f"[red]FAIL:[/] {f}")
        sys.exit(1)
    console.print("[green]verify passed[/]")


@main.command(name="zoo-data")
@click.argument("model")
@click.argument("path", type=click.Path(dir_okay=False))
def zoo_data(model: str, path: str) -> None:
    """Write the held-out test split of trained zoo MODEL (e.g. digits_cnn) to PATH (.npz: x, y)."""
    import numpy as np

    from etforge.zoo import digits

    name = model.removeprefix("zoo:")
    if name not in digits.CONFIGS:
        raise EtforgeError(
            f"zoo model {name!r} has no held-out data; trained zoo models: {', '.join(sorted(digits.CONFIGS))}"
        )
    if not path.endswith(".npz"):
        raise EtforgeError(f"{path}: zoo-data writes a .npz file")
    x, y = digits.test_data(name)
    tmp = f"{path}.tmp.npz"
    np.savez(tmp, x=x.numpy(), y=y.numpy())
    os.replace(tmp, path)  # never a half-written file under the final name
    console.print(f"wrote {path}: x {list(x.shape)} float32, y {list(y.shape)} int64 ({len(y)} test samples)")


@main.group()
def cache() -> None:
    """The build cache (docs/batch.md): where it is, how big, prune or clear it."""


def _size(text: str) -> int:
    """``--max-size``: bytes, or a number with K/M/G/T; a finite, non-negative amount."""
    import math

    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    raw = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in units else (raw, "")
    try:
        value = float(number)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a size (bytes, or a number with K/M/G)", param_hint="--max-size"
        ) from None
    if not math.isfinite(value):
        raise click.BadParameter(f"{text!r} is not a finite size", param_hint="--max-size")
    if value < 0:
        raise click.BadParameter(f"{text!r} is negative", param_hint="--max-size")
    return int(value * units[unit])


def _cache_done(root: Any, removed: list[Any], errors: list[str]) -> None:
    """What a prune or clear did: builds removed, then each failure; exit 1 if any."""
    freed = sum(e.bytes for e in removed)
    damaged = sum(not e.intact for e in removed)
    extra = f", {damaged} of them damaged (no intact manifest)" if damaged else ""
    console.print(f"{root}: removed {len(removed)} builds ({freed:,} B){extra}", soft_wrap=True)
    for line in errors:
        _say("error", line)
    if errors:
        sys.exit(1)


@cache.command(name="info")
def cache_info() -> None:
    """Where the cache is, its entries and their size."""
    from etforge.core.cache.store import BuildCache

    c = BuildCache()
    try:
        entries = c.entries()
    except OSError as exc:
        _say("error", f"cannot read the build cache {c.root}: {exc.strerror or type(exc).__name__}")
        sys.exit(1)
    damaged = [e for e in entries if not e.intact]
    console.print(f"{c.root}: {len(entries)} builds, {sum(e.bytes for e in entries):,} B", soft_wrap=True)
    for e in damaged:
        console.print(f"  damaged (no intact manifest; prune removes it): {e.path}", soft_wrap=True)


@cache.command(name="prune")
@click.option("--max-size", default="1G", show_default=True, help="Keep at most this much (bytes, K/M/G).")
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    default=None,
    metavar="DAYS",
    help="Also drop unused builds.",
)
def cache_prune(max_size: str, older_than: float | None) -> None:
    """Remove damaged builds, then the least recently used until the cache fits."""
    import math

    from etforge.core.cache.store import BuildCache

    if older_than is not None and not math.isfinite(older_than):
        raise click.BadParameter(f"{older_than!r} is not a finite number of days", param_hint="--older-than")
    size = _size(max_size)
    c = BuildCache()
    try:
        removed, errors = c.prune(size, older_than * 86400 if older_than is not None else None)
    except OSError as exc:
        removed, errors = [], [f"cannot read the build cache {c.root}: {exc.strerror or type(exc).__name__}"]
    _cache_done(c.root, removed, errors)


@cache.command(name="clear")
def cache_clear() -> None:
    """Remove every build (damaged ones included)."""
    from etforge.core.cache.store import BuildCache

    c = BuildCache()
    try:
        removed, errors = c.prune(0)
    except OSError as exc:
        removed, errors = [], [f"cannot read the build cache {c.root}: {exc.strerror or type(exc).__name__}"]
    _cache_done(c.root, removed, errors)


if __name__ == "__main__":  # after every command is defined: `python -m etforge.cli cache info`
    run()
