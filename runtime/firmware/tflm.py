"""Host-only NPU partitions in TensorFlow Lite Micro on the Cortex-M33 (an explicit opt-in).

Without NXP's Neutron runtime an imxrt700 / imxrt700cm program's partitions are LiteRT
flatbuffers (payload format ``litert-host-v1``). With ``cpu_partitions`` the firmware image
links ``files/tflm_delegate.cpp``, a delegate backend registered as ``EtforgeNpuBackend`` that
runs each partition in TFLM with CMSIS-NN kernels *on the CPU* — not the NPU; the run says so.

* Sources: TFLM (``--tflm-src`` / ``$ETFORGE_TFLM_SRC``) and its header dependencies
  (``$ETFORGE_TFLM_DEPS``: FlatBuffers with TFLM's patch, gemmlowp, ruy, CMSIS core headers);
  defaults are the snapshots in ``../shared/third_party``.
* One CMSIS-NN: the image's (ExecuTorch's pin ``dbf45dbf``), every integer source of it, for
  both the ``cortex_m`` ops and TFLM's kernels. TFLM's pin ``4ab83cc3`` has byte-identical
  ``Include/`` and ``Source/`` (``identical_cmsis_nn``), so the choice changes no result.
* FlatBuffers: TFLM's translation units see its patched 25.9.23 headers with the namespace
  renamed (``-Dflatbuffers=etforge_tflm_flatbuffers``), ExecuTorch's its 25.2.10: two
  versions in one image, no symbol shared between them.
* The op resolver holds exactly the builtin ops the partitions use (``etforge_tflm_ops.cpp``,
  generated per image, compiled with the kernels; the delegate itself is the same for every
  image). ``cmake_lists`` is what the CMake package's ``etforge_tflm_libraries``
  compiles, for ``etforge run``'s image (in its library tree: the interpreter once, each
  kernel on first use) and for a user's firmware (``etforge_add_runtime``,
  ``ETFORGE_CPU_PARTITIONS``) alike.
"""

from __future__ import annotations

import filecmp
import hashlib
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etforge.core.common.errors import EtforgeError

ENV_TFLM = "ETFORGE_TFLM_SRC"
ENV_TFLM_DEPS = "ETFORGE_TFLM_DEPS"
RECIPE_VERSION = "1"

#: LiteRT builtin op -> (MicroMutableOpResolver method, TFLM kernel sources under micro/kernels).
KERNELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ADD": ("AddAdd", ("cmsis_nn/add", "add_common")),
    "SUB": ("AddSub", ("sub", "sub_common")),
    "MUL": ("AddMul", ("cmsis_nn/mul", "mul_common")),
    "CONV_2D": ("AddConv2D", ("cmsis_nn/conv", "conv_common")),
    "DEPTHWISE_CONV_2D": ("AddDepthwiseConv2D", ("cmsis_nn/depthwise_conv", "depthwise_conv_common")),
    "TRANSPOSE_CONV": ("AddTransposeConv", ("cmsis_nn/transpose_conv",)),
    "FULLY_CONNECTED": ("AddFullyConnected", ("cmsis_nn/fully_connected", "fully_connected_common")),
    "BATCH_MATMUL": ("AddBatchMatMul", ("cmsis_nn/batch_matmul", "batch_matmul_common")),
    "MAX_POOL_2D": ("AddMaxPool2D", ("cmsis_nn/pooling", "pooling_common")),
    "AVERAGE_POOL_2D": ("AddAveragePool2D", ("cmsis_nn/pooling", "pooling_common")),
    "SOFTMAX": ("AddSoftmax", ("cmsis_nn/softmax", "softmax_common")),
    "RESHAPE": ("AddReshape", ("reshape", "reshape_common")),
    "PAD": ("AddPad", ("cmsis_nn/pad", "pad_common")),
    "PADV2": ("AddPadV2", ("cmsis_nn/pad", "pad_common")),
    "MEAN": ("AddMean", ("reduce", "reduce_common")),
    "QUANTIZE": ("AddQuantize", ("quantize", "quantize_common")),
    "DEQUANTIZE": ("AddDequantize", ("dequantize", "dequantize_common")),
    "TRANSPOSE": ("AddTranspose", ("cmsis_nn/transpose", "transpose_common")),
    "CONCATENATION": ("AddConcatenation", ("concatenation",)),
    "STRIDED_SLICE": ("AddStridedSlice", ("strided_slice", "strided_slice_common")),
    "SLICE": ("AddSlice", ("slice",)),
    "LEAKY_RELU": ("AddLeakyRelu", ("leaky_relu", "leaky_relu_common")),
    "PRELU": ("AddPrelu", ("prelu", "prelu_common")),
    "RELU": ("AddRelu", ("activations", "activations_common")),
    "RELU6": ("AddRelu6", ("activations", "activations_common")),
    "HARD_SWISH": ("AddHardSwish", ("hard_swish", "hard_swish_common")),
    "LOGISTIC": ("AddLogistic", ("logistic", "logistic_common")),
    "TANH": ("AddTanh", ("tanh",)),
    "RSQRT": ("AddRsqrt", ("elementwise",)),
    "ABS": ("AddAbs", ("elementwise",)),
    "REDUCE_MAX": ("AddReduceMax", ("reduce", "reduce_common")),
    "REDUCE_MIN": ("AddReduceMin", ("reduce", "reduce_common")),
    "RESIZE_BILINEAR": ("AddResizeBilinear", ("resize_bilinear",)),
    "RESIZE_NEAREST_NEIGHBOR": ("AddResizeNearestNeighbor", ("resize_nearest_neighbor",)),
    "MIRROR_PAD": ("AddMirrorPad", ("mirror_pad",)),
    "SQUEEZE": ("AddSqueeze", ("squeeze",)),
    "EXPAND_DIMS": ("AddExpandDims", ("expand_dims",)),
    "SPLIT": ("AddSplit", ("split",)),
    "GATHER": ("AddGather", ("gather",)),
    "BROADCAST_TO": ("AddBroadcastTo", ("broadcast_to",)),
    "MAXIMUM": ("AddMaximum", ("cmsis_nn/maximum_minimum",)),
    "MINIMUM": ("AddMinimum", ("cmsis_nn/maximum_minimum",)),
}
#: Kernel sources every op needs.
KERNEL_SUPPORT = ("kernel_util", "micro_tensor_utils")

_M = "tensorflow/lite/micro"
#: The TFLM interpreter, allocator and the TFLite shared code it compiles: what an image links.
#: Not compiled (no object of the interpreter, of any kernel in ``KERNELS`` or of the delegate
#: refers to a symbol they define; issue 47): cortex_m_generic/micro_time.cc, micro_profiler.cc,
#: system_setup.cc, memory_planner/non_persistent_buffer_planner_shim.cc,
#: kernels/internal/runtime_shape.cc, kernels/internal/reference/portable_tensor_utils.cc and both
#: tensor_utils.cc. The CMake package's users compile the same list (``cmake_lists``).
CORE = tuple(
    [f"{_M}/{f}" for f in (
        "cortex_m_generic/debug_log.cc", "flatbuffer_utils.cc",
        "memory_helpers.cc", "micro_allocation_info.cc", "micro_allocator.cc", "micro_context.cc",
        "micro_interpreter.cc", "micro_interpreter_context.cc", "micro_interpreter_graph.cc",
        "micro_log.cc", "micro_op_resolver.cc", "micro_resource_variable.cc", "micro_utils.cc",
        "arena_allocator/non_persistent_arena_buffer_allocator.cc",
        "arena_allocator/persistent_arena_buffer_allocator.cc",
        "arena_allocator/single_arena_buffer_allocator.cc", "memory_planner/greedy_memory_planner.cc",
        "memory_planner/linear_memory_planner.cc",
        "tflite_bridge/flatbuffer_conversions_bridge.cc", "tflite_bridge/micro_error_reporter.cc",
    )]
    + [
        "tensorflow/lite/kernels/kernel_util.cc",
        "tensorflow/lite/kernels/internal/portable_tensor_utils.cc",
        "tensorflow/lite/kernels/internal/tensor_ctypes.cc",
        "tensorflow/lite/kernels/internal/common.cc", "tensorflow/lite/kernels/internal/quantization_util.cc",
        "tensorflow/lite/core/api/flatbuffer_conversions.cc", "tensorflow/lite/core/c/common.cc",
        "tensorflow/compiler/mlir/lite/schema/schema_utils.cc",
        "tensorflow/compiler/mlir/lite/core/api/error_reporter.cc",
    ]
)  # fmt: skip


@dataclass(frozen=True)
class TflmSources:
    tflm: Path
    deps: Path


def locate_tflm(tflm_src: str | Path | None = None, deps: str | Path | None = None) -> TflmSources:
    """TFLM and its dependencies, only where the user points (docs/firmware.md, Sources); a
    missing tree is one line naming how to provide it."""
    given_t = tflm_src or os.environ.get(ENV_TFLM)
    given_d = deps or os.environ.get(ENV_TFLM_DEPS)
    if not given_t or not given_d:
        missing = ENV_TFLM if not given_t else ENV_TFLM_DEPS
        raise EtforgeError(
            f"--cpu-partitions needs TensorFlow Lite Micro's sources: set ${missing} "
            "(docs/firmware.md, Sources: TFLM and its FlatBuffers/gemmlowp/ruy/CMSIS headers)"
        )
    t = Path(given_t).expanduser().resolve()
    d = Path(given_d).expanduser().resolve()
    if not (t / _M / "micro_interpreter.cc").is_file():
        raise EtforgeError(
            f"TensorFlow Lite Micro source at {t}: no {_M}/micro_interpreter.cc (--tflm-src or ${ENV_TFLM})"
        )
    if not (d / "flatbuffers/include/flatbuffers/flatbuffers.h").is_file() or not (d / "gemmlowp").is_dir():
        raise EtforgeError(
            f"TFLM dependencies at {d}: need flatbuffers/include, gemmlowp, ruy and cmsis (${ENV_TFLM_DEPS})"
        )
    return TflmSources(t, d)


def host_only_partitions(out: Path, program: Any, plan: Any) -> list[tuple[str, bytes]]:
    """(partition name, LiteRT flatbuffer) of each delegate of ``plan`` (an execution plan of
    ``program``, ExecuTorch's schema ``Program`` or the torch-free view of
    ``core/serialize/pte_read.py``: a CMake configure needs no torch); a delegate that is not a
    host-only LiteRT partition (Neutron microcode) is refused: QEMU has no NPU."""
    from etforge.core.litert import payload
    from etforge.core.serialize.pte_read import INLINE

    parts = []
    for i, d in enumerate(plan.delegates):
        raw = (
            bytes(program.backend_delegate_data[d.processed.index].data)
            if d.processed.location == INLINE
            else b""
        )
        try:
            blob = payload.unpack(raw)
        except (ValueError, KeyError, UnicodeDecodeError, struct.error):
            blob = None
        if blob is None or blob.format != payload.FORMAT_LITERT_HOST:
            kind = "not an etforge payload" if blob is None else f"format {blob.format!r}"
            raise EtforgeError(
                f"{out}: delegate {i} ({d.id}, {kind}) is Neutron NPU code: QEMU has no NPU, and only "
                "host-only LiteRT partitions run on the CPU (--cpu-partitions)"
            )
        parts.append((blob.partition, blob.data))
    return parts


def same_tree(x: Path, y: Path) -> bool:
    """Whether two directory trees hold the same names and the same file bytes."""
    cmp = filecmp.dircmp(x, y)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(x, y, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(same_tree(x / s, y / s) for s in cmp.common_dirs)


def identical_cmsis_nn(a: Path, b: Path) -> bool:
    """Whether two CMSIS-NN trees have the same ``Include/`` and ``Source/`` files, byte for byte."""
    return all(same_tree(a / d, b / d) for d in ("Include", "Source"))


def partition_ops(model: bytes) -> list[str]:
    """Builtin op names a LiteRT flatbuffer uses (sorted); a custom op is refused."""
    from ai_edge_litert import schema_py_generated as schema

    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    m = schema.Model.GetRootAsModel(model, 0)
    ops = set()
    for i in range(m.OperatorCodesLength()):
        oc = m.OperatorCodes(i)
        code = max(int(oc.BuiltinCode()), int(oc.DeprecatedBuiltinCode()))
        name = names.get(code, str(code))
        if name == "CUSTOM":
            raise EtforgeError(
                f"LiteRT partition uses custom op {oc.CustomCode()!r}: TFLM has no kernel for it here"
            )
        ops.add(name)
    return sorted(ops)


#: The generated per-program translation unit (``resolver_source``), compiled into the kernels library.
OPS_SOURCE = "etforge_tflm_ops.cpp"


def resolver_source(ops: list[str], arenas: list[int] | None = None) -> str:
    """``etforge_tflm_ops.cpp``: the resolver holding exactly the builtin ops the partitions use,
    and each partition's TFLM arena in program order (``plugins/targets/tflm_arena.py``, computed
    from the partition at compile time, as report.json and etforge_model.h state it). It is the
    one per-program part: ``files/tflm_delegate.cpp`` reads it through ``etforge_tflm_resolver``
    and the two arrays, so the delegate's compile is the same for every program (compiled once)
    and this small file compiles with the kernels' flags and precompiled headers."""
    missing = [o for o in ops if o not in KERNELS]
    if missing:
        raise EtforgeError(
            f"LiteRT op(s) {', '.join(missing)}: no TFLM kernel in etforge's TFLM build (tflm.KERNELS)"
        )
    calls = "".join(f"    r.{KERNELS[o][0]}();  // {o}\n" for o in ops)
    sizes = [int(a) for a in (arenas or [])]
    return (
        "// Generated by etforge (runtime/firmware/tflm.py): the LiteRT ops this program's partitions use.\n"
        '#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"\n\n'
        f"extern const unsigned etforge_tflm_num_partitions = {len(sizes)};\n"
        "// TFLM arena per partition (bytes, program order): etforge's compile-time bound\n"
        f"extern const unsigned etforge_tflm_arena_bytes[{max(1, len(sizes))}] = "
        f"{{{', '.join(map(str, sizes)) or '0'}}};\n\n"
        "const tflite::MicroOpResolver& etforge_tflm_resolver() {\n"
        f"  static tflite::MicroMutableOpResolver<{max(1, len(ops))}> r;\n"
        "  static bool added = false;\n"
        "  if (!added) {\n" + calls + "    added = true;\n  }\n  return r;\n}\n"
    )


def kernel_sources(ops: list[str] | None = None) -> list[str]:
    """TFLM kernel sources for ``ops`` (every op in ``KERNELS`` when None)."""
    chosen = KERNELS.values() if ops is None else [KERNELS[o] for o in ops]
    stems = sorted({s for _, files in chosen for s in files} | set(KERNEL_SUPPORT))
    return [f"{_M}/kernels/{s}.cc" for s in stems]


def cmsis_nn_int_sources(nn: Path) -> list[str]:
    """Every integer CMSIS-NN source (TFLM's kernels call the s4/s16 paths too), no float."""
    skip = ("_f16", "_f32", "arm_nntables_flt")
    return sorted(
        str(p.relative_to(nn)) for p in (nn / "Source").rglob("*.c") if not any(s in p.stem for s in skip)
    )


#: TFLM's defines, as its own Makefile sets them for cortex_m_generic + cmsis_nn; FlatBuffers'
#: namespace renamed so TFLM's patched headers share no symbol with ExecuTorch's.
DEFINITIONS = (
    "TF_LITE_STATIC_MEMORY", "TF_LITE_DISABLE_X86_NEON", "CMSIS_NN", "KERNELS_OPTIMIZED_FOR_SPEED", "NDEBUG",
    "TF_LITE_MCU_DEBUG_LOG", "CPU_M33=1", 'CMSIS_DEVICE_ARM_CORTEX_M_XX_HEADER_FILE="ARMCM33.h"', "ARMCM33",
    "ARM_NN_ENABLE_F16=0", "ARM_NN_ENABLE_F32=0", "flatbuffers=etforge_tflm_flatbuffers",
)  # fmt: skip


def files_dir() -> Path:
    from etforge.runtime.firmware.build import files_dir as fd

    return fd()


#: The header that makes a TFLM source worth the precompiled header (cmake/etforge.cmake
#: ``ETFORGE_TFLM_PCH``): ~26k lines, 3 of the ~3.4 CPU s of a source that includes it. Loading
#: the ~250 MB PCH costs ~1.3 CPU s per source, so a source that never reaches this header
#: (``debug_log.cc``, the memory planners, TFLite's ``kernel_util.cc``: 0.0-0.5 CPU s alone)
#: compiles without it (issue 47: 13 of the 40 the first image compiles).
PCH_HEADER = "tensorflow/lite/schema/schema_generated.h"
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.MULTILINE)


def _includes(path: Path, roots: list[Path], memo: dict[Path, list[Path]]) -> list[Path]:
    """The files ``path`` includes that exist, resolved as the compiler does (``"..."`` next to
    the includer first, then ``roots``): every ``#include``, inside ``#if`` or not."""
    if path not in memo:
        found = []
        for kind, name in _INCLUDE.findall(path.read_text(errors="replace")):
            where = ([path.parent] if kind == '"' else []) + roots
            hit = next((d / name for d in where if (d / name).is_file()), None)
            if hit is not None:
                found.append(hit.resolve())
        memo[path] = found
    return memo[path]


def _reaches(source: Path, roots: list[Path], target: Path, memo: dict[Path, list[Path]]) -> bool:
    """Whether ``source`` includes ``target``, directly or through the headers it includes
    (over-approximated, as ``_includes``: a source is taken out of the PCH only when it cannot
    need it)."""
    todo, seen = [source.resolve()], set()
    while todo:
        path = todo.pop()
        if path == target:
            return True
        if path not in seen:
            seen.add(path)
            todo.extend(_includes(path, roots, memo))
    return False


def pch_sources(sources: list[str], include_dirs: list[str]) -> list[str]:
    """Of ``sources`` (absolute), those that reach ``PCH_HEADER`` (compiled with the PCH); a
    source not on disk yet (the generated resolver) is counted as one that does."""
    roots = [Path(d) for d in include_dirs]
    target = next(((d / PCH_HEADER).resolve() for d in roots if (d / PCH_HEADER).is_file()), None)
    memo: dict[Path, list[Path]] = {}
    return [
        s for s in sources
        if target is None or not Path(s).is_file() or _reaches(Path(s), roots, target, memo)
    ]  # fmt: skip


def cmake_lists(src: TflmSources, nn: Path, ops: list[str], gen: Path) -> dict[str, list[str]]:
    """What the CMake package's ``etforge_tflm_libraries`` compiles (cmake/etforge.cmake): the
    interpreter, the kernels of ``ops`` with the program's ``gen/etforge_tflm_ops.cpp``
    (``resolver_source``), every integer CMSIS-NN source of the image's one CMSIS-NN tree, the
    delegate, and TFLM's defines and include directories."""
    d = src.deps
    core = [str(src.tflm / f) for f in CORE]
    kernels = [str(src.tflm / f) for f in kernel_sources(ops)] + [str(gen / OPS_SOURCE)]
    includes = [
        str(src.tflm), str(d / "flatbuffers/include"), str(d / "gemmlowp"), str(d / "ruy"),
        str(d / "cmsis/Cortex_DFP/Device/ARMCM33/Include"), str(d / "cmsis/CMSIS/Core/Include"),
        str(nn), str(nn / "Include"), str(files_dir() / "tflm_shim"),
    ]  # fmt: skip
    with_pch = set(pch_sources(core + kernels, includes))
    return {
        "TFLM_CORE_SOURCES": core,
        "TFLM_KERNEL_SOURCES": kernels,
        "TFLM_NO_PCH_SOURCES": [s for s in core + kernels if s not in with_pch],
        "TFLM_NN_SOURCES": [str(nn / f) for f in cmsis_nn_int_sources(nn)],
        "TFLM_DELEGATE_SOURCES": [str(files_dir() / "tflm_delegate.cpp")],
        "TFLM_REGISTER_SOURCES": [str(files_dir() / "tflm_delegate_register.cpp")],
        "TFLM_DEFINITIONS": list(DEFINITIONS),
        "TFLM_INCLUDE_DIRS": includes,
    }


def library_key(src: TflmSources, nn: Path) -> str:
    """Key of TFLM's sources and dependencies: their content and their locations (the object
    files a CMake tree holds are named by absolute source path; see ``build.library_key``)."""
    from etforge.runtime.firmware.build import _compiler_version, _hash_tree

    h = hashlib.sha256(f"etforge-tflm {RECIPE_VERSION}\0".encode())
    h.update(_compiler_version())
    h.update("\0".join(CORE).encode())
    _hash_tree(h, src.tflm, ("tensorflow",))
    _hash_tree(h, src.deps, ("flatbuffers", "gemmlowp", "ruy", "cmsis"))
    _hash_tree(h, nn, ("Include", "Source"))
    h.update("\0".join(str(Path(p).resolve()) for p in (src.tflm, src.deps, nn)).encode())
    return h.hexdigest()[:20]
