"""Every code block in docs/ runs: python blocks in one namespace per page, sh blocks as commands."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from support import REPO, run_cli

DOCS = sorted((REPO / "docs").glob("*.md"))
ORDER = [
    "getting-started.md",
    "architecture.md",
    "targets.md",
    "writing-an-op-plugin.md",
    "writing-a-target-plugin.md",
    "writing-a-rewrite-plugin.md",
    "report.md",
    "codegen.md",
    "batch.md",
    "firmware.md",
    "qat.md",
]
#: The doc commands run as ``python -m etforge`` processes, end to end, as a reader types them; the
#: others run through ``support.run_cli`` (in this process unless they start worker processes, run
#: firmware or need an environment), which saves a torch import per command (issue 47).
END_TO_END = {
    ("getting-started.md", "etforge compile zoo:cifarnet --target imxrt700cm -o out"),
    # the device commands' end-to-end runs (tests elsewhere run them in process)
    ("firmware.md", "etforge run fw-out --on qemu-m33 --samples 2"),
    ("firmware.md", "etforge verify fw-out --runtime qemu-m33 --samples 2"),
}
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def _blocks(path: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(path.read_text())]


def test_every_page_is_tested() -> None:
    assert sorted(p.name for p in DOCS) == sorted(ORDER)
    for page, line in END_TO_END:  # a stale entry would quietly leave no command end to end
        assert line in (REPO / "docs" / page).read_text(), (page, line)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    # firmware.md builds a firmware image: share tests/test_firmware.py's content-hashed cache
    os.environ.setdefault("ETFORGE_FIRMWARE_CACHE", str(request.config.cache.mkdir("etforge-firmware")))
    return tmp_path_factory.mktemp("docs")


#: The pages already run in this process's working directory: a page reads what the pages
#: before it wrote (report.md reads getting-started.md's out/), so selecting one (``-k report``)
#: runs those first.
_RAN: set[str] = set()


@pytest.mark.parametrize("page", ORDER)
def test_page_code_blocks_run(page: str, workdir: Path) -> None:
    for earlier in ORDER[: ORDER.index(page)]:
        if earlier not in _RAN:
            _run_page(earlier, workdir)
    _run_page(page, workdir)


def _run_page(page: str, workdir: Path) -> None:
    _RAN.add(page)  # once, whether or not it passes: its own test reports the failure
    namespace: dict[str, object] = {"__name__": f"docs_{page}"}
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        for lang, code in _blocks(REPO / "docs" / page):
            if lang == "python":
                exec(compile(code, f"docs/{page}", "exec"), namespace)
            elif lang == "sh":
                for line in code.strip().splitlines():
                    argv = shlex.split(line)
                    assert argv[0] == "etforge", line
                    proc = run_cli(*argv[1:], subprocess_only=(page, line) in END_TO_END)
                    assert proc.returncode == 0, f"docs/{page}: {line}\n{proc.stdout}\n{proc.stderr}"
            elif lang not in ("toml", "cmake"):
                raise AssertionError(f"docs/{page}: untested code block language {lang!r}")
    finally:
        os.chdir(cwd)
