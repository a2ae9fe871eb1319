"""Many compiles at once: a manifest of models × targets × options, run in worker processes.

Each job is one ``etforge compile`` child process, so one model that fails (or crashes the
interpreter) cannot stop the others, and each job writes its own complete output directory
through the same atomic path a single compile uses. Locally the jobs are forked from one server
process that made a compile's imports once (``run_local``; a fresh subprocess each where
``os.fork`` is missing): the isolation holds because the server never loads a model or runs a
job itself, so each job starts from the same state a fresh child reaches after its imports and
whatever it changes (its modules, torch's settings, a crash) dies with its process. ``--ray ADDRESS`` runs the same jobs as Ray tasks (Ray is an optional extra), with
the output directories shipped back to the caller as archives and one build cache directory
handed to every worker.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from etforge.core.common.errors import EtforgeError


@dataclass(frozen=True)
class Job:
    """One compile: what ``etforge compile MODEL --target T --option k=v ... -o OUT`` takes."""

    model: str
    target: str
    out: str
    options: tuple[tuple[str, str], ...] = ()
    float_: bool = False
    calib: str | None = None
    #: The caller's cache flags (``--no-cache``, ``--cache direct``), handed to every child.
    cache_args: tuple[str, ...] = ()

    def argv(self, out: str | None = None) -> list[str]:
        args = ["compile", self.model, "--target", self.target, "-o", out or self.out]
        for k, v in self.options:
            args += ["--option", f"{k}={v}"]
        if self.float_:
            args.append("--float")
        if self.calib:
            args += ["--calib", self.calib]
        return args + list(self.cache_args)


@dataclass
class JobResult:
    job: Job
    ok: bool
    seconds: float
    message: str
    #: ``report.json`` facts for the summary table (empty when the compile failed).
    facts: dict[str, Any] = field(default_factory=dict)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"


def _model_slug(model: str) -> str:
    if model.startswith("zoo:"):
        return _slug(model[4:])
    stem = model.rsplit(":", 1)
    path = Path(stem[0])
    return _slug(path.stem + ("_" + stem[1] if len(stem) == 2 and not model.endswith(".pt2") else ""))


def plan(
    models: Sequence[str],
    targets: Sequence[str],
    option_sets: Sequence[dict[str, str]],
    out: Path,
    *,
    float_: bool = False,
    calib: str | None = None,
    cache_args: tuple[str, ...] = (),
) -> list[Job]:
    """Models × targets × option sets; each job's output is ``OUT/<model>/<target>[-<options>]``."""
    jobs = []
    for model in models:
        for target in targets:
            for opts in option_sets or [{}]:
                suffix = "".join(f"-{_slug(k)}={_slug(v)}" for k, v in sorted(opts.items()))
                jobs.append(
                    Job(
                        model=model,
                        target=target,
                        out=str(out / _model_slug(model) / f"{target}{suffix}"),
                        options=tuple(sorted(opts.items())),
                        float_=float_,
                        calib=calib,
                        cache_args=tuple(cache_args),
                    )
                )
    outs = [j.out for j in jobs]
    dupes = sorted({o for o in outs if outs.count(o) > 1})
    if dupes:
        raise EtforgeError(f"two jobs would write the same output directory: {dupes[0]}")
    return jobs


def load_manifest(path: Path, out: Path, cache_args: tuple[str, ...] = ()) -> list[Job]:
    """A JSON or TOML manifest (format in docs/batch.md): ``models``, ``targets``, ``options``
    (a list of option tables, crossed with the rest), plus optional explicit ``jobs``."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise EtforgeError(f"manifest {path}: cannot read it ({exc.strerror})") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise EtforgeError(f"manifest {path}: {len(raw):,} bytes, more than {MAX_MANIFEST_BYTES:,}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise EtforgeError(
            f"manifest {path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line})"
        ) from None
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    if _nesting(text) > MAX_MANIFEST_NESTING:
        raise EtforgeError(f"manifest {path}: nested more than {MAX_MANIFEST_NESTING} levels deep")
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except RecursionError:
        raise EtforgeError(f"manifest {path}: nested too deeply to read as {kind}") from None
    except ValueError as exc:
        raise EtforgeError(f"manifest {path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") from None
    if not isinstance(data, dict):
        raise EtforgeError(f"manifest {path}: expected a table with 'models' and 'targets'")
    unknown = set(data) - {"models", "targets", "options", "jobs", "float", "calib"}
    if unknown:
        raise EtforgeError(f"manifest {path}: unknown key(s) {', '.join(sorted(unknown))}")
    base = path.parent

    def model_ref(m: Any, where: str) -> str:
        if not isinstance(m, str) or not m:
            raise EtforgeError(
                f"manifest {path}: {where} must be a model string (zoo:NAME, file.py:fn, .pt2)"
            )
        if m.startswith("zoo:"):
            return m
        ref, _, fn = m.partition(":") if not m.endswith(".pt2") else (m, "", "")
        resolved = str((base / ref).resolve()) if not Path(ref).is_absolute() else ref
        return f"{resolved}:{fn}" if fn else resolved

    models = [model_ref(m, "models[]") for m in _list(data, "models", path)]
    targets = _list(data, "targets", path)
    option_sets = data.get("options", [{}])
    if isinstance(option_sets, dict):
        option_sets = [option_sets]
    if not isinstance(option_sets, list) or not all(isinstance(o, dict) for o in option_sets):
        raise EtforgeError(f"manifest {path}: 'options' must be a table or a list of tables")
    option_sets = [_option_table(o, path, "options") for o in option_sets]
    float_, calib = data.get("float", False), data.get("calib")
    if not isinstance(float_, bool):
        raise EtforgeError(f"manifest {path}: 'float' must be true or false, not {float_!r}")
    if calib is not None and (not isinstance(calib, str) or not calib):
        raise EtforgeError(f"manifest {path}: 'calib' must be the path of a .pt file, not {calib!r}")
    if calib is not None and not Path(calib).is_absolute():
        calib = str((base / calib).resolve())  # like the models: relative to the manifest
    jobs = [j for m in models for j in _jobs(m, targets, option_sets, out, float_, calib, cache_args)]
    extras = data.get("jobs", [])
    if not isinstance(extras, list):
        raise EtforgeError(f"manifest {path}: 'jobs' must be a list of tables")
    for i, extra in enumerate(extras):
        if not isinstance(extra, dict) or "model" not in extra or not isinstance(extra.get("target"), str):
            raise EtforgeError(f"manifest {path}: jobs[{i}] needs 'model' and 'target'")
        opts = extra.get("options", {})
        if not isinstance(opts, dict):
            raise EtforgeError(f"manifest {path}: jobs[{i}].options must be a table")
        model = model_ref(extra["model"], f"jobs[{i}].model")
        table = _option_table(opts, path, f"jobs[{i}].options")
        jobs += _jobs(model, [extra["target"]], [table], out, float_, calib, cache_args)
    if not jobs:
        raise EtforgeError(f"manifest {path}: no jobs (give 'models' and 'targets', or 'jobs')")
    outs = [j.out for j in jobs]
    dupes = sorted({o for o in outs if outs.count(o) > 1})
    if dupes:
        raise EtforgeError(f"manifest {path}: two jobs would write the same output directory {dupes[0]}")
    return jobs


#: A manifest lists models and options: a few levels of tables and lists, a few kilobytes.
#: Deeper or larger input is refused before it is parsed (a recursive parser would overflow).
MAX_MANIFEST_NESTING = 32
MAX_MANIFEST_BYTES = 16 * 1024 * 1024


def _nesting(text: str) -> int:
    """An upper bound of the manifest's nesting: the deepest run of open brackets (strings
    included: a bound only needs to be no smaller than the truth)."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest


def _jobs(
    model: str,
    targets: list[str],
    option_sets: list[dict[str, str]],
    out: Path,
    float_: bool,
    calib: Any,
    cache_args: tuple[str, ...] = (),
) -> list[Job]:
    return plan([model], targets, option_sets, out, float_=float_, calib=calib, cache_args=cache_args)


def _option_table(table: dict[Any, Any], path: Path, where: str) -> dict[str, str]:
    """A manifest's option table as ``--option`` strings: scalars only (a list is comma-joined)."""
    out = {}
    for key, value in table.items():
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, (str, int, float)):
            raise EtforgeError(
                f"manifest {path}: {where}.{key} must be a string, number or boolean, not {value!r}"
            )
        out[str(key)] = str(value)
    return out


def _list(data: dict[str, Any], key: str, path: Path) -> list[str]:
    value = data.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EtforgeError(f"manifest {path}: {key!r} must be a list of strings")
    return value


def _etforge_argv() -> list[str]:
    return [sys.executable, "-m", "etforge"]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _facts(out: Path) -> dict[str, Any]:
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return {}
    return {
        "partitions": len(report.get("partitions", [])),
        "npu_share": report.get("macs", {}).get("npu_share"),
        "pte_bytes": report.get("memory", {}).get("pte_bytes"),
    }


def _env(env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(env or {}), "COLUMNS": "100"}


def _result(job: Job, code: int, seconds: float, stdout: str, stderr: str, out: str | None) -> JobResult:
    """A finished child's JobResult: its last error line (and signal), or its report's facts."""
    if code != 0:
        why = _last_line(stderr) or _last_line(stdout) or f"exit code {code}"
        if code < 0:
            why = f"killed by signal {-code}: {why}"
        return JobResult(job, False, seconds, why)
    facts = {**_facts(Path(out or job.out)), "cached": "from the build cache" in stdout}
    return JobResult(job, True, seconds, "ok", facts)


def run_job(job: Job, env: dict[str, str] | None = None, out: str | None = None) -> JobResult:
    """One job as a child ``etforge compile`` process."""
    start = time.perf_counter()
    proc = subprocess.run(
        [*_etforge_argv(), *job.argv(out)],
        capture_output=True,
        text=True,
        errors="backslashreplace",  # a child naming a non-UTF-8 path prints its raw bytes
        env=_env(env),
        stdin=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - start
    return _result(job, proc.returncode, seconds, proc.stdout, proc.stderr, out)


#: Why a local batch runs each job as a subprocess of its own (no ``os.fork`` here), or None:
#: the batch summary says it, once.
NO_FORK_NOTE = (
    None
    if hasattr(os, "fork")
    else "this platform has no os.fork: each job is a fresh `etforge compile` process (imports torch anew)"
)


def run_local(
    jobs: Sequence[Job], workers: int | None = None, on_done: Callable[[JobResult], None] | None = None
) -> list[JobResult]:
    """Run every job in parallel child processes (``workers``: default one per core).

    Each job is a child forked from one server process (``cli/batch_server.py``) that was
    started as a job's own ``python -m etforge`` child would be and has made a compile's imports
    (torch, ExecuTorch, the compile stack: ~3-4 CPU s a job saved) and nothing else: every job
    still runs in a process of its own, so a crash, a model's modules and torch's process-wide
    state end with it. Without ``os.fork`` (:data:`NO_FORK_NOTE`) each job is a fresh
    subprocess."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if NO_FORK_NOTE is not None:
        return _run_subprocesses(jobs, workers, on_done)
    return _run_forked(jobs, workers, on_done)


def _run_subprocesses(
    jobs: Sequence[Job], workers: int, on_done: Callable[[JobResult], None] | None
) -> list[JobResult]:
    results: dict[int, JobResult] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_job, job): i for i, job in enumerate(jobs)}
        for future, i in futures.items():
            res = future.result()
            results[i] = res
            if on_done:
                on_done(res)
    return [results[i] for i in range(len(jobs))]


#: Prefix of the fork server's result lines (``cli/batch_server.py`` writes them; anything else
#: on its stdout is ignored).
RESULT = "etforge-batch-job "


def _run_forked(
    jobs: Sequence[Job], workers: int, on_done: Callable[[JobResult], None] | None
) -> list[JobResult]:
    """The jobs as children of one fork server; results reported in the jobs' order."""
    results: dict[int, JobResult] = {}
    with tempfile.TemporaryDirectory(prefix="etforge-batch-") as tmp:
        logs = [(os.path.join(tmp, f"{i}.out"), os.path.join(tmp, f"{i}.err")) for i in range(len(jobs))]
        spec = os.path.join(tmp, "jobs.json")
        with open(spec, "w") as f:
            json.dump(
                {"workers": workers, "jobs": [[j.argv(), *log] for j, log in zip(jobs, logs, strict=True)]}, f
            )
        server_err = os.path.join(tmp, "server.err")
        reported = 0

        def report() -> None:
            nonlocal reported
            while reported in results:
                if on_done:
                    on_done(results[reported])
                reported += 1

        with open(server_err, "wb") as err:
            server = subprocess.Popen(
                [*_etforge_argv(), "--batch-fork-server", spec],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env=_env(None),
                text=True,
            )
            assert server.stdout is not None
            for line in server.stdout:
                if not line.startswith(RESULT):
                    continue
                done = json.loads(line[len(RESULT) :])
                i = done["i"]
                out, errlog = (_read_log(p) for p in logs[i])
                results[i] = _result(jobs[i], done["code"], done["seconds"], out, errlog, None)
                report()
            code = server.wait()
        if len(results) < len(jobs):  # the server itself failed: every job it did not report
            why = _last_line(_read_log(server_err)) or f"exit code {code}"
            for i, job in enumerate(jobs):
                results.setdefault(i, JobResult(job, False, 0.0, f"the batch's fork server failed: {why}"))
            report()
    return [results[i] for i in range(len(jobs))]


def _read_log(path: str) -> str:
    """A child's captured output as text (a non-UTF-8 path it printed: backslash escapes)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="backslashreplace").replace("\r\n", "\n")


def _ray_task(job_fields: dict[str, Any], env: dict[str, str]) -> tuple[dict[str, Any], bytes]:
    """Runs on a Ray worker: compile into a private directory and ship it back as a tar archive."""
    job = Job(
        **{
            **job_fields,
            "options": tuple(tuple(p) for p in job_fields["options"]),
            "cache_args": tuple(job_fields.get("cache_args", ())),
        }
    )
    with tempfile.TemporaryDirectory(prefix="etforge-ray-") as tmp:
        out = str(Path(tmp) / "out")
        res = run_job(job, env, out=out)
        blob = b""
        if res.ok:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for p in sorted(Path(out).rglob("*")):
                    tar.add(p, arcname=str(p.relative_to(out)), recursive=False)
            blob = buf.getvalue()
        return {"ok": res.ok, "seconds": res.seconds, "message": res.message, "facts": res.facts}, blob


#: What a local Ray instance (``--ray local``) changes in its workers' environment.
#:
#: ``RAY_worker_niceness=0``: Ray starts every worker process 15 nice levels below its caller
#: (its ``worker_niceness`` setting, meant to keep a cluster node's raylet responsive), and
#: each job's ``etforge compile`` child inherits that. On the caller's own machine the jobs ARE
#: the work asked for; 15 levels down a job gets about 3% of a core against a process at the
#: caller's niceness (CFS weights 36 : 1024), so beside other work it starves. Measured on the
#: 2-core machine, 12 jobs of tests/batch_models.py beside two busy processes: 857 s wall
#: (each compile 114-179 s) for 64 CPU s; with the variable, 135 s for 55 CPU s (quiet
#: machine: 71 s). The variable is the one Ray's job manager sets for a job's driver; a worker
#: reads it before it lowers its priority, so the jobs run at the caller's, as ``--jobs`` does.
#: A remote cluster's (``--ray ADDRESS``) settings are its administrator's and stay untouched.
LOCAL_WORKER_ENV = {"RAY_worker_niceness": "0"}


def run_ray(
    jobs: Sequence[Job],
    address: str,
    cache_dir: str | None,
    on_done: Callable[[JobResult], None] | None = None,
) -> list[JobResult]:
    """The same jobs as Ray tasks on the cluster at ``address`` ("local" starts one here).

    A local instance gets Ray's defaults but two: no dashboard, and :data:`LOCAL_WORKER_ENV`
    (the workers at the caller's priority: the cause of ``--ray local``'s collapse on a busy
    machine). Measured and left as they are: Ray's start-up, 12 trivial tasks and shutdown
    cost 4.2 CPU s (seven Python processes importing Ray) and its idle daemons about 0.5 CPU s
    per 20 s, small beside a job's ~4 CPU s compile; Ray counts the cores as ``--jobs`` does,
    one task per core. Each job stays a fresh child ``etforge compile`` (not forked from a
    preloaded server as ``--jobs``'s are) rather than running inside the Ray worker (which
    would save the child's start-up) for the isolation ``--jobs`` has:
    a model that crashes the interpreter, two model files of one module name, or torch's
    process-wide state must not leak from one job into the next.
    """
    try:
        import ray
    except ImportError:
        raise EtforgeError("--ray needs Ray: pip install 'etforge[ray]'") from None
    env = {"ETFORGE_CACHE_DIR": cache_dir} if cache_dir else {}
    # Workers import etforge from where the caller does (an editable checkout included).
    package_parent = str(Path(__file__).resolve().parent.parent.parent)
    pythonpath = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH", "")) if p)
    env_vars = {**env, "PYTHONPATH": pythonpath}
    if address == "local":
        env_vars.update(LOCAL_WORKER_ENV)
    runtime_env = {"env_vars": env_vars}
    started_here = not ray.is_initialized()
    if started_here:
        kwargs: dict[str, Any] = {"runtime_env": runtime_env, "log_to_driver": False}
        if address != "local":
            kwargs["address"] = address
        else:
            kwargs["include_dashboard"] = False
        try:
            ray.init(**kwargs)
        except Exception as exc:
            raise EtforgeError(f"cannot connect to Ray at {address!r}: {exc}") from None
    try:
        task = ray.remote(num_cpus=1)(_ray_task)
        refs = [task.remote(asdict(job), env) for job in jobs]
        results = []
        for job, ref in zip(jobs, refs, strict=True):
            try:
                meta, blob = ray.get(ref)
            except Exception as exc:  # a worker that died: the job failed, the others go on
                res = JobResult(job, False, 0.0, f"Ray task failed: {_last_line(str(exc))}")
            else:
                res = JobResult(job, meta["ok"], meta["seconds"], meta["message"])
                if res.ok:
                    _unpack(blob, Path(job.out))
                    res.facts = {**_facts(Path(job.out)), "cached": meta["facts"].get("cached")}
            results.append(res)
            if on_done:
                on_done(res)
        return results
    finally:
        if started_here:
            ray.shutdown()


def _unpack(blob: bytes, out: Path) -> None:
    """Replace ``out`` with the archive's tree, atomically (staged beside it, then swapped)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.ray-"))
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(staging, filter="data")
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        os.replace(out, old / "x")
    os.replace(staging, out)
    if old is not None:
        import shutil

        shutil.rmtree(old, ignore_errors=True)


def summary_rows(results: Iterable[JobResult]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        f = r.facts
        share = f.get("npu_share")
        rows.append(
            (
                r.job.model,
                r.job.target + "".join(f" {k}={v}" for k, v in r.job.options),
                "ok" if r.ok else "FAILED",
                f"{r.seconds:.1f} s",
                str(f.get("partitions", "")) if r.ok else "",
                f"{100 * share:.0f}%" if r.ok and share is not None else "",
                ("cache" if f.get("cached") else "") if r.ok else r.message,
            )
        )
    return rows
