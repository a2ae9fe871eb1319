"""``etforge compile``: one model into OUT, or several (``--manifest``) through :mod:`etforge.cli.batch`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

import click
from rich.markup import escape

from etforge.cli.batch import compile_many
from etforge.cli.common import (
    OUTPUT,
    Ctx,
    console,
    defer_stack_imports,
    named_target,
    parse_options,
    print_summary,
    resolved_options,
    say,
    warn_missing_kernels,
)
from etforge.core.common.errors import EtforgeError
from etforge.core.registry.manager import Registry


@click.command(name="compile")
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
    "--calib",
    "calib",
    type=click.Path(),
    help="Calibration data: a .pt file with a list of input tuples, or a .npz with x ([N, *input]; x0, x1 ... for several inputs), as verify --data reads.",
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
@click.option(
    "--memory-map",
    "memory_map",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE.toml",
    help="Fail unless the firmware's buffers fit the board's regions (docs/firmware.md, memory map).",
)
@click.option("--no-cache", is_flag=True, help="Compile afresh; neither read nor fill the build cache.")
@click.option(
    "--cache",
    "cache_mode",
    type=click.Choice(["auto", "direct"]),
    default="auto",
    show_default=True,
    help="'direct': also restore a factory's build before importing torch, trusting what it was "
    "seen to read (docs/batch.md: the caveat); 'auto' does so only for .pt2 and zoo: models.",
)
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
    memory_map: str | None,
    no_cache: bool,
    cache_mode: str,
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

    OUTPUT["quiet"] = quiet or as_json
    if manifest or len(models) > 1 or ray_address:
        if etrecord or memory_budget or memory_map or as_json or no_fallback:
            raise click.UsageError(
                "--etrecord, --memory-budget, --memory-map, --no-fallback and --json go with a single model"
            )
        compile_many(
            obj,
            models,
            manifest,
            target_name,
            Path(out_dir),
            calib,
            float_,
            raw_options,
            jobs,
            ray_address,
            cache_args=("--no-cache",)
            if no_cache
            else ("--cache", cache_mode)
            if cache_mode != "auto"
            else (),
        )
        return
    if not models:
        raise click.UsageError("give a MODEL (or several, or --manifest FILE)")
    if jobs is not None:
        raise click.UsageError("--jobs goes with several models or --manifest")
    model = models[0]
    from etforge.core.build import output
    from etforge.core.cache import store as cache

    regions = None
    if memory_map is not None:  # a bad map fails before anything is compiled
        from etforge.codegen.memory_map import load_memory_map

        regions = load_memory_map(Path(memory_map))
    out = Path(out_dir)
    reg = obj.registry
    target = named_target(reg, target_name)
    options = resolved_options(target, parse_options(raw_options))  # usage errors (exit 2) first
    _check_model_path(model)  # a wrong path fails here, before torch loads
    staging = output.prepare(out)  # OUT must be replaceable before anything is compiled
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
                cache_mode == "direct",
            )
            generated, report, cached = _compile_into(job)
            fit = _check_memory_map(staging, report, regions, memory_map) if regions is not None else None
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
        warn_missing_kernels(generated)
        return
    if quiet:
        from etforge.core.build.summary import final_line

        console.print(escape(final_line(report, str(out))), soft_wrap=True)
        warn_missing_kernels(generated)
        return
    if cached:
        console.print("[green]✓[/] restored from the build cache (nothing changed since it was built)")
    console.print(
        f"cache: {info.get('mode', 'miss')} ({escape(str(info.get('reason', '')))})", soft_wrap=True
    )
    print_summary(report, out, generated)
    if fit is not None:
        _print_memory_map(report, fit, memory_map)


def _check_memory_map(
    staging: Any, report: dict[str, Any], regions: dict[str, Any], path: str | None
) -> list[dict[str, Any]]:
    """Each region's use; an error naming the buffer that does not fit (OUT is left as it was)."""
    from pathlib import Path

    from etforge.codegen.memory_map import check_fit

    buffers = report.get("memory", {}).get("firmware_buffers")
    if buffers is None:  # a build cached before the list existed
        buffers = _add_firmware_buffers(staging, report)
    return check_fit(buffers, regions, Path(str(path)))


def _print_memory_map(report: dict[str, Any], fit: list[dict[str, Any]], path: str | None) -> None:
    console.print(f"memory map {escape(str(path))}:", soft_wrap=True)
    for b in report["memory"]["firmware_buffers"]:
        console.print(
            f"  {escape(b['buffer'])}: {b['bytes']:,} B ({b['basis']}) in {escape(b['section'])}"
            + (f", inside {escape(b['inside'])}" if b.get("inside") else ""),
            soft_wrap=True,
        )
    for r in fit:
        console.print(f"  region {escape(r['region'])}: {r['used']:,} of {r['size']:,} B", soft_wrap=True)


def _add_firmware_buffers(staging: Any, report: dict[str, Any]) -> list[dict[str, Any]]:
    """``report["memory"]["firmware_buffers"]`` (codegen.memory_map), written into the staged report."""
    from etforge.codegen.memory_map import firmware_buffers
    from etforge.core.build import output

    buffers = firmware_buffers(staging / output.PTE, report)
    report.setdefault("memory", {})["firmware_buffers"] = buffers
    (staging / output.REPORT).write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    return buffers


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
    #: ``--cache direct``: a factory's build may be restored in direct mode (the author's call).
    cache_direct: bool = False

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
    first in direct mode (``core.cache.direct``: what the user typed and the files the model
    read last time, before torch is imported), then with the full key after the front end
    (torch, the model, ``torch.export``); ExecuTorch, torchao and LiteRT are imported only
    when the build has to run.
    """
    from etforge.core.build import output

    staging, reg, model, target, options, calib = (job.staging, job.reg, job.model, job.target, job.options, job.calib)  # fmt: skip
    float_, use_cache, flags = job.float_, job.use_cache, job.flags
    direct = None
    direct_off = "direct mode unavailable for this command line"
    if use_cache:
        from etforge.core.cache import store as cache
        from etforge.core.cache.direct import Session, basis

        how, direct_off = basis(model, job.cache_direct)
        if how is not None:
            direct = Session.open(
                model=model,
                target=target,
                options=options,
                flags=flags,
                calib=calib,
                reg=reg,
                exclude=[staging],
                how=how,
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
            say("warning", f"{direct.why}; rebuilding")
            direct.distrust(staging)  # never trusted: the entry goes, the normal path rebuilds
    recording = direct.recording() if direct is not None else contextlib.nullcontext()
    from etforge.core.common import fallbacks

    with fallbacks.recording(job.no_fallback):  # the front end's and the compile's
        generated, report, cached, key = _build_into(job, recording)
    if not use_cache:
        return generated, _cache_info(staging, report, "miss", "the build cache is off"), cached
    if direct is not None and key is not None:
        direct.save(key)
    direct_why = direct.why if direct is not None else direct_off
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
    loaded, calibration, front = _front_end(job, recording)
    key = None
    if job.use_cache:
        from etforge.core.cache import store as cache

        key = cache.compile_key(front, job.reg, job.model, job.target, job.options, job.flags)
        restored = _restored(job, key)
        if restored is not None:
            return None, restored, True, key
    report = _compile_and_write(job, loaded, calibration, front)
    with _progress("codegen"):
        from etforge.codegen import generate
        from etforge.core.build import output

        generated = generate(job.staging / output.PTE, job.staging / output.CODEGEN, report=report)
        _add_firmware_buffers(job.staging, report)
    if key is not None:
        from etforge.core.cache import store as cache

        try:
            cache.BuildCache().store(key, job.staging)
        except cache.CacheError as exc:  # a full or read-only cache never fails the compile
            say("warning", str(exc))
            key = None
    return generated, report, False, key


def _check_model_path(spec: str) -> None:
    """The file a MODEL names exists and is of its kind, else one error line (the checks
    ``core.front.load`` makes first, made here without importing torch: a typo in a path
    costs no torch import)."""
    from pathlib import Path

    if spec.startswith("zoo:"):
        from etforge.zoo.catalog import CATALOG  # the names, without torch (test_zoo_command)

        known = sorted(m.name for m in CATALOG)
        if spec[4:] not in known:
            raise EtforgeError(f"unknown zoo model {spec[4:]!r}; known: {', '.join(known)}")
        return
    if spec.endswith(".pt2"):
        path = Path(spec)
    elif ":" not in spec:
        raise EtforgeError(f"model {spec!r}: expected zoo:NAME, path/to/file.py:factory or a .pt2 file")
    else:
        path = Path(spec.rsplit(":", 1)[0])
        if path.suffix != ".py":
            raise EtforgeError(f"model {spec!r}: {path} is not a .py file")
    if not path.is_file():
        raise EtforgeError(f"model file {path} does not exist")


def front_imports() -> None:
    """The ``import`` stage: torch, then the front end (also what a batch's fork server makes
    before forking its jobs, ``cli/batch_server.py``)."""
    import torch  # noqa: F401  (its import time is this stage)

    from etforge.core.common.registration_source import record_sources_cheaply

    record_sources_cheaply()  # before the imports that register ~300 fake kernels
    import etforge.core.front.export  # noqa: F401
    import etforge.core.front.load  # noqa: F401


def stack_imports() -> None:
    """The ``import executorch`` stage: ExecuTorch's stack (its unread package inits deferred)
    and the compile session (also made by a batch's fork server)."""
    defer_stack_imports()
    import etforge.core.build.report  # noqa: F401
    import etforge.core.build.session  # noqa: F401
    import etforge.core.serialize.program_writer  # noqa: F401


def _front_end(job: _Job, recording: contextlib.AbstractContextManager[Any]) -> tuple[Any, Any, Any]:
    """(the loaded model, its calibration, the exported front end), ``recording`` watching."""
    with _progress("import"):
        front_imports()
        from etforge.core.front.export import front_end
        from etforge.core.front.load import load_calibration, load_model
    with recording:
        with _progress("load"):
            loaded = load_model(job.model)
            calibration = loaded.calibration
            if job.calib:
                calibration = load_calibration(job.calib, loaded.example_inputs)
        with _progress("export"):
            front = front_end(
                loaded.module,
                loaded.example_inputs,
                calibration,
                job.target,
                job.options,
                job.reg,
                loaded.program,
                job.model,
                owned=True,  # loaded for this compile alone: converted in place, not copied
            )
    return loaded, calibration, front


def _restored(job: _Job, key: str) -> dict[str, Any] | None:
    """The report of the build the cache restored into ``staging`` under ``key``, when it is
    trusted; else None (an untrusted entry is discarded: the caller rebuilds)."""
    from etforge.core.build import output
    from etforge.core.cache import store as cache

    build_cache = cache.BuildCache()
    if build_cache.restore(key, job.staging):
        try:
            restored = output.load_report(job.staging / output.REPORT)
            problem = cache.check_report(
                restored, model=job.model, target=job.target.name, quantized=not job.float_
            )
        except EtforgeError as exc:
            problem = str(exc)
        if problem is None:
            return restored
        say("warning", f"the cached build {key[:12]} was not trusted: {problem}; rebuilding")
        build_cache.discard(key)
        from etforge.core.cache.direct import Session

        Session.restore_failed(job.staging)
    elif build_cache.why.startswith("the cached entry"):
        say("warning", f"{build_cache.why}; rebuilding")
    return None


def _compile_and_write(job: _Job, loaded: Any, calibration: Any, front: Any) -> dict[str, Any]:
    """The compile session (``core.build.session``, as ``etforge.compile``), then OUT's files
    and the report; returns the report."""
    from etforge.core.build import output

    with _progress("import executorch"):
        stack_imports()
        from etforge.core.build.report import build_report
        from etforge.core.build.session import CompileSession
        from etforge.core.serialize.program_writer import ProgramWriter
    # float.pt2 / quantized.pt2 / lowered_edge.exir are written by child processes while this one works.
    names = (output.FLOAT_PROGRAM, output.QUANTIZED_PROGRAM)
    with ProgramWriter(job.staging, names, lowered=output.LOWERED_PROGRAM) as writer:
        session = CompileSession(
            job.target,
            reg=job.reg,
            options=job.options,
            quantize=not job.float_,
            memory_budget=job.memory_budget,
            progress=_progress,
            on_programs=writer.start,
            on_lowered=writer.start_lowered,
        )  # strict or not: the recording _compile_into opened decides
        result = session.run(
            loaded.module,
            loaded.example_inputs,
            calibration=calibration,
            program=loaded.program,
            what=job.model,
            front=front,
        )
        result.notes[:0] = loaded.notes  # e.g. a dynamic batch fixed to the example's size
        with _progress("write"):
            writer.finish()
            report = build_report(result, job.reg, job.model)
            output.write_outputs(job.staging, result, report, programs=False)
    if job.etrecord:
        with _progress("etrecord"):
            output.write_etrecord(job.staging, result)
    return report


def _progress(stage: str) -> Any:
    """A spinner while ``stage`` runs (on a terminal), then one line with its time."""
    import contextlib
    import time

    @contextlib.contextmanager
    def run() -> Any:
        start = time.perf_counter()
        if OUTPUT["quiet"]:
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
