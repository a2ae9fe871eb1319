"""The ``etforge`` command line.

Exit codes: 0 success, 1 the job failed (bad model, plugin error under --strict, parity
above threshold ...), 2 bad usage. Describing commands never import torch. Every failure is
one ``error:`` line naming its culprit; ``--debug`` (or ``ETFORGE_DEBUG=1``) adds the
traceback. Third-party noise is silenced unless ``-v`` (``core.common.quiet``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import click

from etforge.cli.cache import cache
from etforge.cli.cmake import cmake_dir_cmd, cmake_runtime_cmd
from etforge.cli.codegen import codegen
from etforge.cli.common import BROKEN_PIPE_EXIT, DEBUG, PIPE, Ctx, console, fail, fit_width, say
from etforge.cli.compile import compile_cmd
from etforge.cli.device import run_cmd
from etforge.cli.listing import ops, plugins, targets
from etforge.cli.report import report
from etforge.cli.verify import verify
from etforge.cli.zoo import zoo
from etforge.cli.zoo_data import zoo_data
from etforge.core.common.errors import EtforgeError, first_line


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
            fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            fail("interrupted", 130)
        except EtforgeError as exc:
            fail(str(exc))
        except BrokenPipeError:  # click.echo (--json) to a closed pipe, after the work is done
            console.on_broken_pipe()
        except Exception as exc:  # a bug (ours or a plugin's): still one line, the traceback on request
            fail(f"unexpected {type(exc).__name__}: {first_line(exc)} (run with --debug for the traceback)")
        if PIPE["broken"]:
            say("warning", "stdout was closed early (broken pipe): the rest of the output was dropped; "
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

    DEBUG["on"] = DEBUG["on"] or debug
    quiet.install(verbose)  # before any command imports torch
    fit_width()
    ctx.obj = Ctx(strict)


# One module per command (each imports torch and the core lazily, inside the command).
for _command in (plugins, targets, ops, compile_cmd, report, codegen, run_cmd, verify, zoo_data, zoo, cache):
    main.add_command(_command)
for _command in (cmake_dir_cmd, cmake_runtime_cmd):  # the firmware build's CMake package
    main.add_command(_command)

__all__ = ["EtforgeGroup", "main", "run"]
