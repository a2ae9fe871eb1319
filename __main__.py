import sys

if sys.argv[1:] == ["--cmake-dir"]:  # as pybind11/nanobind: no CLI start-up for the build's query
    from etforge.cli.cmake import cmake_dir

    print(cmake_dir())
    sys.exit(0)

if sys.argv[1:2] == ["--batch-fork-server"] and len(sys.argv) == 3:  # a local batch's jobs
    from etforge.cli.batch_server import serve

    serve(sys.argv[2])

from etforge.cli import run

run()
