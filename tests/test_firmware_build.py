"""The QEMU image ``etforge run`` builds goes through etforge's CMake package (one build system:
``runtime/firmware/files/CMakeLists.txt`` over ``etforge_runtime_libraries``), cached by content;
a missing tool or a compile error is one line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from shared_outputs import compile_once

from etforge.cli.cmake import cmake_dir
from etforge.core.common.errors import EtforgeError
from etforge.runtime.firmware import build, conformance, sources

pytestmark = pytest.mark.skipif(conformance.missing() is not None, reason=str(conformance.missing()))


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fwb")
    proc = compile_once("zoo:digits_cnn", "--target", "cortex-m33", out=root)  # as test_firmware's
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def test_image_is_built_by_the_cmake_package(out: Path) -> None:
    """The library tree is a CMake build of files/CMakeLists.txt that includes the package's
    etforge.cmake; the image's ELF is reused, unchanged, by a second build."""
    image = build.build_image(out)
    lib = build.cache_root() / f"libs-{build.library_key(sources.locate())}"
    cache = (lib / "build" / "CMakeCache.txt").read_text()
    assert f"ETFORGE_CMAKE_DIR:UNINITIALIZED={cmake_dir()}" in cache
    assert f"etforge_qemu_an505_SOURCE_DIR:STATIC={build.files_dir()}" in cache
    assert (lib / ".complete").is_file() and image.elf.is_file()
    again = build.build_image(out)
    assert again.elf == image.elf and again.built == [] and again.seconds == 0.0
    assert not list(build.files_dir().glob("*.mk"))  # no second, private build system


def test_missing_cmake_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("arm-none-eabi-gcc", "arm-none-eabi-g++", "arm-none-eabi-ar", "make"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(EtforgeError, match=r"^firmware build needs cmake on PATH \(Debian: apt-get install"):
        build.check_tools()


def test_compile_error_is_one_line(out: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    reg = bad / "codegen" / "etforge_model_kernels.cpp"
    reg.write_text(reg.read_text() + "\nthis_is_not_cpp;\n")
    with pytest.raises(EtforgeError) as e:
        build.build_image(bad)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"firmware build failed (image for {bad}): ")
    assert "etforge_model_kernels.cpp" in message and "error" in message


def test_a_copy_elsewhere_gets_its_own_library_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CMake tree records its source directory: the same content configured from another
    place (a second checkout or venv sharing the cache) must not reuse it, or CMake refuses to
    reconfigure it for the next image."""
    src = sources.locate()
    here = build.library_key(src)
    copy = tmp_path / "files"
    shutil.copytree(build.files_dir(), copy)
    monkeypatch.setattr(build, "files_dir", lambda: copy)
    assert build.library_key(src) != here
    monkeypatch.undo()
    assert build.library_key(src) == here  # and the key is stable where nothing moved
