# etforge's CMake package: find_package(etforge CONFIG REQUIRED) with
#   -Detforge_DIR=$(etforge cmake-dir)   (or python -m etforge --cmake-dir)
# provides etforge_add_model() and etforge_add_runtime() (etforge.cmake, documented there).
#
# ETFORGE_PYTHON: the Python where etforge is installed; by default the interpreter of the
# environment this directory was installed into (<venv>/bin/python), else Python3 on PATH.
if(CMAKE_VERSION VERSION_LESS 3.20)
  message(FATAL_ERROR "etforge's CMake package needs CMake 3.20 or newer (this is ${CMAKE_VERSION})")
endif()
include_guard(GLOBAL)

set(ETFORGE_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
if(NOT ETFORGE_PYTHON AND DEFINED ENV{ETFORGE_PYTHON})
  set(ETFORGE_PYTHON "$ENV{ETFORGE_PYTHON}")
endif()
if(NOT ETFORGE_PYTHON)
  # <prefix>/lib/pythonX.Y/site-packages/etforge/cmake -> <prefix>/bin/python3
  get_filename_component(_etforge_prefix "${CMAKE_CURRENT_LIST_DIR}/../../../../.." ABSOLUTE)
  find_program(ETFORGE_PYTHON NAMES python3 python PATHS "${_etforge_prefix}/bin" NO_DEFAULT_PATH)
  if(NOT ETFORGE_PYTHON)
    find_package(Python3 COMPONENTS Interpreter QUIET)
    set(ETFORGE_PYTHON "${Python3_EXECUTABLE}" CACHE FILEPATH "Python with etforge installed")
  endif()
endif()
execute_process(
  COMMAND "${ETFORGE_PYTHON}" -c "import etforge.cli.cmake as m; print(m.cmake_dir())"
  WORKING_DIRECTORY "${CMAKE_CURRENT_LIST_DIR}"  # no folder here shadows an installed etforge
  RESULT_VARIABLE _etforge_rc OUTPUT_VARIABLE _etforge_dir ERROR_VARIABLE _etforge_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _etforge_rc EQUAL 0)
  message(FATAL_ERROR "etforge: ETFORGE_PYTHON=${ETFORGE_PYTHON} cannot import etforge; "
    "set -DETFORGE_PYTHON=<the python where you pip-installed etforge>")
endif()

get_property(_etforge_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
if(NOT "ASM" IN_LIST _etforge_languages)
  enable_language(ASM)  # the embedded program is an assembler .incbin
endif()

include("${CMAKE_CURRENT_LIST_DIR}/etforge.cmake")
set(etforge_FOUND TRUE)
