# etforge_add_model(<target> PTE <model.pte> [NAME <c_name>] [NAMESPACE <ns>] [REPORT <report.json>]
#                   [SECTION <pte section>] [ARENA_SECTION <s>] [NPU_SECTION <s>])
#   Runs `etforge codegen` at build time (the .pte and its report.json are the dependencies:
#   touching them regenerates, an unchanged .pte rebuilds nothing) and adds to <target>:
#   <NAME>_api.h/.cpp (the C API: <NAME>_init, <NAME>_run), the kernel registration, the .pte
#   embedded as <NAME>_pte (16-aligned, section SECTION, default .rodata.etforge_pte), and the
#   planned arenas and runtime pools (ARENA_SECTION, default .bss.etforge_arena) and NPU/TFLM
#   working memory (NPU_SECTION, default .bss.etforge_npu) as static buffers.
#   NAME defaults to the .pte's file name without extension; NAMESPACE to etforge_<NAME>.
#
# etforge_add_runtime(<target> EXECUTORCH_SRC <dir> CMSIS_NN_SRC <dir> [TFLM_SRC <dir>]
#                     [TFLM_DEPS <dir>] [CPU cortex-m33|cortex-m55])
#   Builds ExecuTorch's runtime, prim ops, the cortex_m ops and the kernels the target's models
#   select (the union of their operators), and CMSIS-NN, from the user's source trees, and links
#   them into <target>. Defaults: the CMake variables / environment variables
#   ETFORGE_EXECUTORCH_SRC, ETFORGE_CMSIS_NN_SRC, ETFORGE_TFLM_SRC, ETFORGE_TFLM_DEPS; CPU cortex-m33.
#   A model with NPU partitions is refused at configure time: etforge ships no Neutron runtime.
#   With the option ETFORGE_CPU_PARTITIONS=ON its host-only partitions (imxrt700 / imxrt700cm
#   compiled without NXP's converter) run in TensorFlow Lite Micro on the CPU instead (not the
#   NPU), built from TFLM_SRC and TFLM_DEPS (one model with partitions per firmware).
#   The lists are made once all of the directory's etforge_add_model calls are seen (deferred).
include_guard(GLOBAL)

option(ETFORGE_CPU_PARTITIONS "run host-only NPU partitions in TFLM on the CPU (not the NPU)" OFF)
option(ETFORGE_TFLM_PCH "precompile the headers every TFLM source includes (once per flag set)" ON)

set(_ETFORGE_KEYWORDS
  auto break case char const continue default do double else enum extern float for goto if
  inline int long register restrict return short signed sizeof static struct switch typedef
  union unsigned void volatile while _Alignas _Alignof _Atomic _Bool _Complex _Generic
  _Imaginary _Noreturn _Static_assert _Thread_local alignas alignof and and_eq asm bitand
  bitor bool catch char8_t char16_t char32_t class compl concept consteval constexpr constinit
  const_cast co_await co_return co_yield decltype delete dynamic_cast explicit export false
  friend mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected
  public reinterpret_cast requires static_assert static_cast template this thread_local throw
  true try typeid typename using virtual wchar_t xor xor_eq main std)

# The runtime's static libraries reference each other both ways: they are linked as one group.
# CMake's platform files declare the RESCAN feature for hosted GNU targets, not for bare metal.
foreach(_lang C CXX)
  if(NOT CMAKE_${_lang}_LINK_GROUP_USING_RESCAN_SUPPORTED)
    set(CMAKE_${_lang}_LINK_GROUP_USING_RESCAN "LINKER:--start-group" "LINKER:--end-group")
    set(CMAKE_${_lang}_LINK_GROUP_USING_RESCAN_SUPPORTED TRUE)
  endif()
endforeach()

file(GLOB _ETFORGE_TEMPLATES "${CMAKE_CURRENT_LIST_DIR}/../codegen/templates/*.j2")

function(_etforge_check_ident what value)
  if(NOT value MATCHES "^[A-Za-z_][A-Za-z0-9_]*$" OR value MATCHES "^(__|_[A-Z])")
    message(FATAL_ERROR "etforge_add_model: ${what} '${value}' is not a C identifier ([A-Za-z_][A-Za-z0-9_]*, not starting with __ or _X)")
  endif()
  string(LENGTH "${value}" _len)
  if(_len GREATER 63)
    message(FATAL_ERROR "etforge_add_model: ${what} '${value}' is longer than 63 characters")
  endif()
  if(value IN_LIST _ETFORGE_KEYWORDS)
    message(FATAL_ERROR "etforge_add_model: ${what} '${value}' is a C/C++ keyword; pick another name")
  endif()
endfunction()

function(_etforge_check_section what value)
  if(NOT value MATCHES "^\\.?[A-Za-z_][A-Za-z0-9_.]*$" OR value MATCHES "\\.\\.")
    message(FATAL_ERROR "etforge_add_model: ${what} '${value}' is not a section name ([.]name of letters, digits, _ and .)")
  endif()
endfunction()

function(etforge_add_model target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG ""
    "PTE;NAME;NAMESPACE;REPORT;SECTION;ARENA_SECTION;NPU_SECTION" "")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "etforge_add_model(${target}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "etforge_add_model: ${target} is not a target (add_executable first)")
  endif()
  if(NOT ARG_PTE)
    message(FATAL_ERROR "etforge_add_model(${target}): PTE <model.pte> is required")
  endif()
  get_filename_component(pte "${ARG_PTE}" ABSOLUTE)
  if(NOT EXISTS "${pte}")
    message(FATAL_ERROR "etforge_add_model(${target}): PTE ${pte} does not exist")
  endif()
  file(READ "${pte}" _head LIMIT 8 HEX)
  string(SUBSTRING "${_head}" 8 4 _ident)
  if(NOT _ident STREQUAL "4554")
    message(FATAL_ERROR "etforge_add_model(${target}): PTE ${pte} is not an ExecuTorch program (no 'ET' file identifier)")
  endif()
  if(ARG_REPORT)
    get_filename_component(report "${ARG_REPORT}" ABSOLUTE)
  else()
    get_filename_component(_dir "${pte}" DIRECTORY)
    set(report "${_dir}/report.json")
  endif()
  if(NOT EXISTS "${report}")
    message(FATAL_ERROR "etforge_add_model(${target}): PTE ${pte} is not a program etforge compiled: "
      "no ${report} (etforge compile writes it beside model.pte; or pass REPORT)")
  endif()
  if(NOT ARG_NAME)
    get_filename_component(ARG_NAME "${pte}" NAME_WE)
  endif()
  _etforge_check_ident(NAME "${ARG_NAME}")
  if(NOT ARG_NAMESPACE)
    set(ARG_NAMESPACE "etforge_${ARG_NAME}")
  endif()
  string(REPLACE "::" ";" _parts "${ARG_NAMESPACE}")
  foreach(_p IN LISTS _parts)
    _etforge_check_ident(NAMESPACE "${_p}")
  endforeach()
  foreach(_s SECTION ARENA_SECTION NPU_SECTION)
    if(ARG_${_s})
      _etforge_check_section(${_s} "${ARG_${_s}}")
    endif()
  endforeach()
  get_property(_names TARGET ${target} PROPERTY ETFORGE_MODELS)
  if(ARG_NAME IN_LIST _names)
    message(FATAL_ERROR "etforge_add_model(${target}): two models named '${ARG_NAME}' in one firmware; give one a different NAME")
  endif()

  set(name "${ARG_NAME}")
  # "etforge-gen": no directory the build runs Python in may be importable as "etforge" (python -m
  # puts the working directory first on sys.path, where a folder named etforge would shadow
  # an editable install); the commands also run inside their own output directory.
  set(gen "${CMAKE_CURRENT_BINARY_DIR}/etforge-gen/${target}/${name}")
  file(MAKE_DIRECTORY "${gen}")
  set(outputs "${gen}/${name}_kernels.cpp" "${gen}/${name}.h" "${gen}/${name}_api.h"
    "${gen}/${name}_api.cpp" "${gen}/${name}_pte.S" "${gen}/${name}.pte" "${gen}/selected_operators.yaml")
  set(sections)
  if(ARG_SECTION)
    list(APPEND sections --pte-section "${ARG_SECTION}")
  endif()
  if(ARG_ARENA_SECTION)
    list(APPEND sections --arena-section "${ARG_ARENA_SECTION}")
  endif()
  if(ARG_NPU_SECTION)
    list(APPEND sections --npu-section "${ARG_NPU_SECTION}")
  endif()
  add_custom_command(
    OUTPUT ${outputs}
    COMMAND "${ETFORGE_PYTHON}" -m etforge codegen "${pte}" -o "${gen}" --report "${report}"
            --c-api "${name}" --namespace "${ARG_NAMESPACE}" ${sections}
    # codegen leaves unchanged files alone; the outputs must still be newer than the .pte
    COMMAND "${CMAKE_COMMAND}" -E touch ${outputs}
    # a newer etforge (its templates) regenerates too
    DEPENDS "${pte}" "${report}" ${_ETFORGE_TEMPLATES}
    COMMENT "etforge codegen ${name}: ${pte}"
    WORKING_DIRECTORY "${gen}"
    VERBATIM)
  target_sources(${target} PRIVATE "${gen}/${name}_kernels.cpp" "${gen}/${name}_api.cpp" "${gen}/${name}_pte.S")
  set_source_files_properties("${gen}/${name}_pte.S" PROPERTIES
    OBJECT_DEPENDS "${gen}/${name}.pte" COMPILE_OPTIONS "-Wa,-I${gen}")
  target_include_directories(${target} PRIVATE "${gen}")
  set_property(TARGET ${target} APPEND PROPERTY ETFORGE_MODELS "${name}")
  set_property(TARGET ${target} APPEND PROPERTY ETFORGE_MODEL_PTES "${pte}")
  # the runtime's kernel list is the programs' operators: a changed program re-runs configure
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${pte}")
endfunction()

function(etforge_add_runtime target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "EXECUTORCH_SRC;CMSIS_NN_SRC;TFLM_SRC;TFLM_DEPS;CPU" "")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "etforge_add_runtime(${target}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "etforge_add_runtime: ${target} is not a target (add_executable first)")
  endif()
  foreach(_v EXECUTORCH_SRC CMSIS_NN_SRC TFLM_SRC TFLM_DEPS)
    if(NOT ARG_${_v} AND ETFORGE_${_v})
      set(ARG_${_v} "${ETFORGE_${_v}}")
    elseif(NOT ARG_${_v} AND DEFINED ENV{ETFORGE_${_v}})
      set(ARG_${_v} "$ENV{ETFORGE_${_v}}")
    endif()
  endforeach()
  set(_probe_EXECUTORCH_SRC "runtime/executor/method.cpp")
  set(_probe_CMSIS_NN_SRC "Include/arm_nnfunctions.h")
  set(_get_EXECUTORCH_SRC "the pytorch/executorch source, v1.5.x")
  set(_get_CMSIS_NN_SRC "ARM-software/CMSIS-NN at dbf45dbfcc515421dd6099037d3e2637b90748c8 (your MCU SDK's CMSIS-NN)")
  foreach(_v EXECUTORCH_SRC CMSIS_NN_SRC)
    _etforge_check_tree(${target} ${_v} "${ARG_${_v}}" "${_probe_${_v}}" "${_get_${_v}}")
    get_filename_component(ARG_${_v} "${ARG_${_v}}" ABSOLUTE)
  endforeach()
  if(NOT ARG_CPU)
    set(ARG_CPU cortex-m33)
  endif()
  if(NOT ARG_CPU MATCHES "^cortex-m(33|55)$")
    message(FATAL_ERROR "etforge_add_runtime(${target}): CPU '${ARG_CPU}' is not cortex-m33 or cortex-m55")
  endif()
  get_property(_done TARGET ${target} PROPERTY ETFORGE_RUNTIME SET)
  if(_done)
    message(FATAL_ERROR "etforge_add_runtime(${target}): called twice for one target")
  endif()
  set_property(TARGET ${target} PROPERTY ETFORGE_RUNTIME
    "${ARG_EXECUTORCH_SRC};${ARG_CMSIS_NN_SRC};${ARG_CPU};${ARG_TFLM_SRC};${ARG_TFLM_DEPS}")
  cmake_language(EVAL CODE "cmake_language(DEFER CALL _etforge_build_runtime [[${target}]])")
endfunction()

# A source tree the user must point at: one configure-time line naming the variable to set.
function(_etforge_check_tree target var dir probe get)
  if(NOT dir)
    message(FATAL_ERROR "etforge_add_runtime(${target}): ${var} is not set: pass ${var} <dir>, or set "
      "-DETFORGE_${var}=<dir> or the environment variable ETFORGE_${var} (${get}; see etforge's docs/firmware.md)")
  endif()
  get_filename_component(dir "${dir}" ABSOLUTE)
  if(NOT EXISTS "${dir}/${probe}")
    message(FATAL_ERROR "etforge_add_runtime(${target}): ${var} ${dir} has no ${probe} (${get})")
  endif()
endfunction()

function(_etforge_build_runtime target)
  get_property(_rt TARGET ${target} PROPERTY ETFORGE_RUNTIME)
  list(GET _rt 0 et)
  list(GET _rt 1 nn)
  list(GET _rt 2 cpu)
  list(GET _rt 3 tflm)
  list(GET _rt 4 tflm_deps)
  get_property(ptes TARGET ${target} PROPERTY ETFORGE_MODEL_PTES)
  if(NOT ptes)
    message(FATAL_ERROR "etforge_add_runtime(${target}): no etforge_add_model(${target} ...) in this directory")
  endif()
  set(dir "${CMAKE_CURRENT_BINARY_DIR}/etforge-gen/${target}")
  file(MAKE_DIRECTORY "${dir}")
  set(tflm_args)
  if(ETFORGE_CPU_PARTITIONS)
    # host-only NPU partitions run in TFLM on the CPU (not the NPU): an explicit opt-in
    _etforge_check_tree(${target} TFLM_SRC "${tflm}" "tensorflow/lite/micro/micro_interpreter.cc"
      "tensorflow/tflite-micro, the revision docs/firmware.md pins")
    _etforge_check_tree(${target} TFLM_DEPS "${tflm_deps}" "flatbuffers/include/flatbuffers/flatbuffers.h"
      "TFLM's downloads: flatbuffers, gemmlowp, ruy, cmsis; docs/firmware.md")
    list(APPEND tflm_args --cpu-partitions --tflm-src "${tflm}" --tflm-deps "${tflm_deps}")
  endif()
  message(STATUS "etforge: selecting ${target}'s runtime sources (ExecuTorch ${et}, CMSIS-NN ${nn}, ${cpu})")
  execute_process(
    COMMAND "${ETFORGE_PYTHON}" -m etforge cmake-runtime --executorch-src "${et}" --cmsis-nn-src "${nn}"
            --cpu "${cpu}" --include-dir "${dir}/runtime" -o "${dir}/runtime.cmake" ${tflm_args} ${ptes}
    WORKING_DIRECTORY "${dir}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(STRIP "${err}${out}" err)
    string(REGEX REPLACE "^error: " "" err "${err}")
    message(FATAL_ERROR "etforge_add_runtime(${target}): ${err}")
  endif()
  etforge_runtime_libraries(${target}_etforge LISTS "${dir}/runtime.cmake")
  list(LENGTH ETFORGE_RT_OPERATORS _nops)
  message(STATUS "etforge: ${target} links ${_nops} operator(s) (selective build over its models)")
  # prim ops register themselves from static initializers: their objects are linked whole
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:${target}_etforge_prim_ops>)
  set(libs ${target}_etforge_ops ${target}_etforge_kernels)
  if(ETFORGE_RT_TFLM_CORE_SOURCES)
    etforge_tflm_libraries(${target}_etforge SELF_REGISTER)
    message(STATUS "etforge: ${target}'s NPU partitions run in TFLM on the CPU (ETFORGE_CPU_PARTITIONS; not the NPU)")
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:${target}_etforge_tflm_delegate>)
    # the generated registration stops a host-only program unless the build says it is meant
    target_compile_definitions(${target} PRIVATE ETFORGE_ALLOW_HOST_ONLY)
    list(APPEND libs ${target}_etforge_tflm_kernels ${target}_etforge_tflm ${target}_etforge_cmsis_nn_int)
  endif()
  target_link_libraries(${target} PRIVATE ${target}_etforge_config
    "$<LINK_GROUP:RESCAN,${libs};${target}_etforge_cmsis_nn;${target}_etforge_core>")
endfunction()

# ---- lower-level functions (the QEMU image etforge run builds uses these too) ---------------
# etforge_runtime_libraries(<prefix> [LISTS <file>...])
#   From the ETFORGE_RT_* lists `etforge cmake-runtime` (or etforge's QEMU build) wrote, included
#   from LISTS: <prefix>_config
#   (INTERFACE: includes, definitions, CPU and language flags), <prefix>_core (runtime, static),
#   <prefix>_prim_ops (objects: link them whole), <prefix>_ops (cortex_m ops and the portable
#   utilities they use), <prefix>_kernels (the selected portable/quantized kernels),
#   <prefix>_cmsis_nn (CMSIS-NN's int8 sources). The lists stay set in the caller's scope.
macro(etforge_runtime_libraries prefix)
  cmake_parse_arguments(_ERL "" "" "LISTS" ${ARGN})
  foreach(_erl_file IN LISTS _ERL_LISTS)
    include("${_erl_file}")
  endforeach()
  _etforge_runtime_libraries(${prefix})
endmacro()

function(_etforge_runtime_libraries prefix)
  set(cfg ${prefix}_config)
  add_library(${cfg} INTERFACE)
  target_include_directories(${cfg} INTERFACE ${ETFORGE_RT_INCLUDE_DIRS})
  target_compile_definitions(${cfg} INTERFACE ${ETFORGE_RT_DEFINITIONS})
  target_compile_options(${cfg} INTERFACE ${ETFORGE_RT_CPU_FLAGS}
    $<$<COMPILE_LANGUAGE:C,CXX>:-ffunction-sections -fdata-sections>
    $<$<COMPILE_LANGUAGE:CXX>:-fno-exceptions -fno-rtti -fno-unwind-tables -Wno-psabi -Wno-deprecated-declarations>)
  target_compile_features(${cfg} INTERFACE cxx_std_17)
  target_link_options(${cfg} INTERFACE ${ETFORGE_RT_CPU_FLAGS})
  add_library(${prefix}_core STATIC ${ETFORGE_RT_CORE_SOURCES})
  add_library(${prefix}_prim_ops OBJECT ${ETFORGE_RT_PRIM_SOURCES})
  add_library(${prefix}_ops STATIC ${ETFORGE_RT_OPS_SOURCES})
  add_library(${prefix}_cmsis_nn STATIC ${ETFORGE_RT_NN_SOURCES})
  if(ETFORGE_RT_KERNEL_SOURCES)
    add_library(${prefix}_kernels STATIC ${ETFORGE_RT_KERNEL_SOURCES})
  else()
    add_library(${prefix}_kernels INTERFACE)
  endif()
  foreach(_lib core prim_ops ops cmsis_nn kernels)
    get_target_property(_type ${prefix}_${_lib} TYPE)
    if(NOT _type STREQUAL "INTERFACE_LIBRARY")
      target_link_libraries(${prefix}_${_lib} PUBLIC ${cfg})
      set_target_properties(${prefix}_${_lib} PROPERTIES CXX_EXTENSIONS ON)
    endif()
  endforeach()
endfunction()

# etforge_tflm_libraries(<prefix> [LISTS <file>...] [SELF_REGISTER])
#   TensorFlow Lite Micro as the stand-in for host-only NPU partitions (on the CPU, not the NPU),
#   with TFLM's own flags: <prefix>_tflm (interpreter, -Os), <prefix>_tflm_kernels (the
#   partitions' ops, -O2), <prefix>_cmsis_nn_int (every integer CMSIS-NN source) and
#   <prefix>_tflm_delegate (objects: the EtforgeNpuBackend delegate; SELF_REGISTER registers it
#   from a static initializer, for firmware without etforge's runner).
macro(etforge_tflm_libraries prefix)
  cmake_parse_arguments(_ETL "SELF_REGISTER" "" "LISTS" ${ARGN})
  foreach(_etl_file IN LISTS _ETL_LISTS)
    include("${_etl_file}")
  endforeach()
  _etforge_tflm_libraries(${prefix} ${_ETL_SELF_REGISTER})
endmacro()

function(_etforge_tflm_libraries prefix self_register)
  set(cfg ${prefix}_tflm_config)
  add_library(${cfg} INTERFACE)
  target_include_directories(${cfg} INTERFACE ${ETFORGE_RT_TFLM_INCLUDE_DIRS})
  target_compile_definitions(${cfg} INTERFACE ${ETFORGE_RT_TFLM_DEFINITIONS})
  target_compile_options(${cfg} INTERFACE ${ETFORGE_RT_CPU_FLAGS} -fno-unwind-tables
    -fno-asynchronous-unwind-tables -ffunction-sections -fdata-sections -fmessage-length=0
    -fomit-frame-pointer -funsigned-char
    $<$<COMPILE_LANGUAGE:CXX>:-fno-rtti -fno-exceptions -fno-threadsafe-statics -Wno-psabi>)
  target_compile_features(${cfg} INTERFACE cxx_std_17)
  add_library(${prefix}_tflm STATIC ${ETFORGE_RT_TFLM_CORE_SOURCES})
  target_compile_options(${prefix}_tflm PRIVATE -Os)
  add_library(${prefix}_tflm_kernels STATIC ${ETFORGE_RT_TFLM_KERNEL_SOURCES})
  target_compile_options(${prefix}_tflm_kernels PRIVATE -O2)
  foreach(_lib tflm tflm_kernels)
    target_link_libraries(${prefix}_${_lib} PUBLIC ${cfg})
    set_target_properties(${prefix}_${_lib} PROPERTIES CXX_EXTENSIONS OFF)
  endforeach()
  if(ETFORGE_TFLM_PCH)
    _etforge_tflm_pch(${prefix}_tflm ${cfg} -Os)
    _etforge_tflm_pch(${prefix}_tflm_kernels ${cfg} -O2)
    # a source that never includes schema_generated.h compiles faster than the PCH loads
    # (runtime/firmware/tflm.py pch_sources); the same object either way
    if(ETFORGE_RT_TFLM_NO_PCH_SOURCES)
      set_source_files_properties(${ETFORGE_RT_TFLM_NO_PCH_SOURCES} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endif()
  add_library(${prefix}_cmsis_nn_int STATIC ${ETFORGE_RT_TFLM_NN_SOURCES})
  target_compile_options(${prefix}_cmsis_nn_int PRIVATE ${ETFORGE_RT_CPU_FLAGS} -O2 -ffunction-sections -fdata-sections)
  target_compile_definitions(${prefix}_cmsis_nn_int PRIVATE ARM_NN_ENABLE_F16=0 ARM_NN_ENABLE_F32=0)
  list(FILTER ETFORGE_RT_INCLUDE_DIRS INCLUDE REGEX "/Include$")
  target_include_directories(${prefix}_cmsis_nn_int PRIVATE ${ETFORGE_RT_INCLUDE_DIRS})
  # the delegate sees TFLM's headers first (its FlatBuffers over ExecuTorch's), then the runtime's
  set(defs ${ETFORGE_RT_TFLM_DEFINITIONS})
  list(FILTER defs EXCLUDE REGEX "HEADER_FILE")
  add_library(${prefix}_tflm_delegate OBJECT ${ETFORGE_RT_TFLM_DELEGATE_SOURCES})
  target_include_directories(${prefix}_tflm_delegate BEFORE PRIVATE ${ETFORGE_RT_TFLM_INCLUDE_DIRS})
  target_compile_definitions(${prefix}_tflm_delegate PRIVATE ${defs} ETFORGE_ALLOW_HOST_ONLY ETFORGE_TFLM_PARTITIONS)
  if(self_register)
    # the registration is a file of its own: the delegate compiles as in etforge's QEMU image
    target_sources(${prefix}_tflm_delegate PRIVATE ${ETFORGE_RT_TFLM_REGISTER_SOURCES})
  endif()
  target_link_libraries(${prefix}_tflm_delegate PUBLIC ${prefix}_config)
  set_target_properties(${prefix}_tflm_delegate PROPERTIES CXX_EXTENSIONS ON)
endfunction()

# The headers nearly every TFLM source includes: 3.2 of a kernel's 3.8 CPU s is parsing them
# (~100k lines, most of it tensorflow/lite/schema/schema_generated.h).
set(_ETFORGE_TFLM_PCH_HEADERS
  tensorflow/lite/schema/schema_generated.h tensorflow/lite/c/common.h
  tensorflow/lite/c/builtin_op_data.h tensorflow/lite/kernels/internal/types.h
  tensorflow/lite/kernels/internal/common.h tensorflow/lite/kernels/internal/quantization_util.h
  tensorflow/lite/kernels/internal/tensor_ctypes.h tensorflow/lite/kernels/kernel_util.h
  tensorflow/lite/kernels/op_macros.h tensorflow/lite/micro/kernels/kernel_util.h
  tensorflow/lite/micro/micro_log.h tensorflow/lite/micro/micro_utils.h Include/arm_nnfunctions.h)

# _etforge_tflm_pch(<library> <config> <opt>): <library> (a TFLM library of `cfg`'s flags with
# `opt`) compiles with the precompiled _ETFORGE_TFLM_PCH_HEADERS (ETFORGE_TFLM_PCH, default ON).
# GCC bakes the optimisation level into a PCH's inline functions, so each flag set has its own,
# made once per project by a target named after the flags (not the prefix): the interpreter
# and the kernels of every firmware of those flags share it, and the compile lines (which name
# the PCH) are the same in every build tree, so a compiler cache serves all of them.
function(_etforge_tflm_pch lib cfg opt)
  string(REPLACE "${CMAKE_BINARY_DIR}" "@" _flags
    "${opt};${ETFORGE_RT_CPU_FLAGS};${ETFORGE_RT_TFLM_DEFINITIONS};${ETFORGE_RT_TFLM_INCLUDE_DIRS}")
  string(MD5 _hash "${_flags}")
  string(SUBSTRING "${_hash}" 0 10 _hash)
  string(REPLACE "-" "" _o "${opt}")
  set(pch etforge_tflm_pch_${_o}_${_hash})
  if(NOT TARGET ${pch})
    set(_src "${CMAKE_BINARY_DIR}/etforge-gen/tflm_pch.cc")
    file(CONFIGURE OUTPUT "${_src}" CONTENT "// etforge: the TFLM precompiled headers' own translation unit\n")
    add_library(${pch} OBJECT "${_src}")
    target_link_libraries(${pch} PRIVATE ${cfg})
    target_compile_options(${pch} PRIVATE ${opt})
    set_target_properties(${pch} PROPERTIES CXX_EXTENSIONS OFF)
    list(TRANSFORM _ETFORGE_TFLM_PCH_HEADERS PREPEND "<" OUTPUT_VARIABLE _headers)
    list(TRANSFORM _headers APPEND ">")
    target_precompile_headers(${pch} PRIVATE ${_headers})  # every TFLM source is C++
  endif()
  target_precompile_headers(${lib} REUSE_FROM ${pch})
endfunction()
