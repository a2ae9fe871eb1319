"""No user string reaches generated code unescaped (issue 48).

The ``.pte`` file name and the report's strings carry newlines, ``*/``, quotes, ``${}``,
``$(...)``, backslashes, trigraphs and non-ASCII; the generated C++ compiles with the same
lines as a plainly named program's, the CMake fragment runs nothing injected, the YAML reads
back the name exactly. Names that become code (``--prefix``, ``--namespace``) are refused,
one line each, keywords with the list.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import yaml

from etforge.codegen import escape, generate
from etforge.core.build import output
from etforge.core.build.report import build_report
from etforge.core.build.session import compile_model
from etforge.core.common.errors import EtforgeError
from etforge.core.registry.manager import registry

from support import conv_head

INCLUDE = Path(sysconfig.get_paths()["purelib"]) / "executorch" / "include"
C10 = INCLUDE / "executorch" / "runtime" / "core" / "portable_type" / "c10"

#: A hostile file name (no '/': a file name cannot hold one) and hostile report strings.
INJECT = 'm\nexecute_process(COMMAND "${CMAKE_COMMAND}" -E touch PWNED)\n# "q" \'s ${X} $(touch PWNED2) \\ ??= é\r\\'
INJECT_TEXT = INJECT + ' ??/ */ int injected = 1; /* "); system("touch PWNED3'


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reg = registry()
    model, calib = conv_head()
    result = compile_model(model, calib[0], "imxrt700", calibration=calib, reg=reg)
    d = tmp_path_factory.mktemp("prog")
    output.write_outputs(d, result, build_report(result, reg, "conv_head"))
    return d


def _hostile_copy(program: Path, where: Path) -> Path:
    """The program under a hostile file name, its report's strings hostile too."""
    where.mkdir()
    for f in program.iterdir():
        if f.is_file():
            shutil.copy(f, where / f.name)
    report = json.loads((where / "report.json").read_text())
    for field in ("target", "cpu", "isa"):
        report[field] = INJECT_TEXT
    report.setdefault("memory", {})["npu_source"] = INJECT_TEXT
    for part in report["memory"].get("npu_partitions", []):
        part["name"] = INJECT_TEXT
    report.setdefault("npu_compiler", {})["status"] = INJECT_TEXT
    (where / "report.json").write_text(json.dumps(report))
    pte = where / (INJECT + ".pte")
    (where / "model.pte").rename(pte)
    return pte


def _compile_cxx(gen: Path, namespace: str, tmp: Path) -> None:
    main = tmp / "main.cpp"
    header = next(gen.glob("*.h")).name
    main.write_text(
        f'#include "{header}"\nint init() {{ return static_cast<int>({namespace}::register_kernels()); }}\n'
    )
    for src in [*gen.glob("*.cpp"), main]:
        cmd = ["g++", "-std=c++17", "-Wall", "-Werror", "-c", f"-I{INCLUDE}", f"-I{C10}", f"-I{gen}",
               "-DC10_USING_CUSTOM_GENERATED_MACROS", str(src), "-o", str(tmp / (src.stem + ".o"))]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_hostile_names_compile_and_inject_nothing(program: Path, tmp_path: Path) -> None:
    plain = generate(program / "model.pte", tmp_path / "plain", namespace="fw::model")
    pte = _hostile_copy(program, tmp_path / "hostile")
    gen = tmp_path / "gen"
    hostile = generate(pte, gen, namespace="fw::model")
    assert set(hostile.files) == set(plain.files)
    for name, data in hostile.files.items():  # no line added, every byte printable ASCII
        assert data.count(b"\n") == plain.files[name].count(b"\n"), name
        assert all(b == 10 or 32 <= b < 127 for b in data), name
    _compile_cxx(gen, "fw::model", tmp_path)

    # The CMake fragment runs nothing injected when it is included.
    script = tmp_path / "run"
    script.mkdir()
    (script / "s.cmake").write_text(
        f'include("{gen / "etforge_model.cmake"}")\nmessage(STATUS "${{ETFORGE_MODEL_SOURCES}}")\n'
    )
    proc = subprocess.run(
        ["cmake", "-P", str(script / "s.cmake")], cwd=script, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in script.iterdir()) == ["s.cmake"]  # no PWNED file
    assert "etforge_model_kernels.cpp" in proc.stdout + proc.stderr

    # The YAML reads back the file name exactly.
    data = yaml.safe_load((gen / "selected_operators.yaml").read_text())
    assert all(v["debug_info"] == [pte.name] for v in data["operators"].values())
    assert set(data["operators"]) == set(hostile.registered)


@pytest.mark.parametrize(
    ("prefix", "namespace", "culprit"),
    [
        ("a\nb", "fw", "--prefix"),
        ("x*/", "fw", "--prefix"),
        ('p"', "fw", "--prefix"),
        ("${X}", "fw", "--prefix"),
        ("$(id)", "fw", "--prefix"),
        ("é", "fw", "--prefix"),
        ("", "int", "keyword"),
        ("", "class", "keyword"),
        ("", "fw::std", "std"),
        ("", "a\nb", "--namespace"),
        ("", "fw::é", "--namespace"),
        ("", "fw*/", "--namespace"),
        ("", "fw::__x", "reserved"),
    ],
)
def test_names_that_become_code_are_refused_in_one_line(
    program: Path, tmp_path: Path, prefix: str, namespace: str, culprit: str
) -> None:
    with pytest.raises(EtforgeError) as err:
        generate(program / "model.pte", tmp_path, prefix=prefix, namespace=namespace)
    message = str(err.value)
    assert "\n" not in message.replace(repr(prefix), "").replace(repr(namespace), "")
    assert culprit in message
    if culprit == "keyword":
        assert "alignas" in message and "while" in message  # the list is given
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_escapers_round_trip() -> None:
    """Each escaper's output means its input in its language: C strings through the compiler,
    CMake arguments through cmake, YAML through a YAML reader."""
    texts = [INJECT_TEXT, "plain", "tab\there", "\x00nul", "a??=b", "x\\"]
    src = (
        "#include <cstdio>\nint main() {\n"
        + "".join(
            f'  std::fwrite({escape.c_string(t)}, 1, sizeof({escape.c_string(t)}) - 1, stdout); std::puts("");\n'
            for t in texts
        )
        + "}\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "t.cpp").write_text(src)
        subprocess.run(
            ["g++", "-std=c++17", "-Wall", "-Werror", "-trigraphs", "t.cpp", "-o", "t"], cwd=tmp, check=True
        )
        out = subprocess.run([str(Path(tmp) / "t")], capture_output=True, check=True).stdout
        assert out == b"".join(t.encode() + b"\n" for t in texts)
        cm = "".join(f"message(STATUS {escape.cmake_arg(t)})\n" for t in texts if "\x00" not in t)
        (Path(tmp) / "s.cmake").write_text(cm)
        # One argument each; a ';' stays escaped, as in a list element (docstring of cmake_arg).
        proc = subprocess.run(["cmake", "-P", "s.cmake"], cwd=tmp, capture_output=True, check=True)
        assert proc.stdout == b"".join(
            f"-- {t}\n".replace(";", "\\;").encode() for t in texts if "\x00" not in t
        )
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["s.cmake", "t", "t.cpp"]
    for t in texts:
        assert yaml.safe_load(f"k: {escape.yaml_scalar(t)}\n") == {"k": t}
        for comment in (escape.c_comment(t), escape.cmake_comment(t), escape.yaml_comment(t)):
            assert "\n" not in comment and "\r" not in comment and not comment.endswith("\\")
        assert "*/" not in escape.c_comment(t) and "??" not in escape.c_comment(t)
