import sys

if sys.argv[1:] == ["--cmake-dir"]:  # as pybind11/nanobind: no CLI start-up for the build's query
    from etforge.cli.cmake import cmake_dir

    print(cmake_dir())
    sys.exit(0)

from etforge.cli import run

run()
