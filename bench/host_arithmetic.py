"""Benchmark: a CPU library's host arithmetic, numpy/torch port vs its own C compiled for the host.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/host_arithmetic.py [--repeat 5]

Issue 44 asks whether the host arithmetic of the device's libraries (the numpy/torch ports:
``plugins/targets/cortex_m_host.py`` for CMSIS-NN, ``runtime/arithmetic`` for LiteRT's integer
kernels) should instead be the libraries' C compiled for the host. This measures one real
case: MobileNetV2 (224x224) convolution layers, each run by the port
(``cortex_m_host.quantized_conv2d`` / ``quantized_depthwise_conv2d``, as ``verify`` runs them)
and by CMSIS-NN's C (``arm_convolve_wrapper_s8`` / ``arm_depthwise_conv_wrapper_s8`` through
``tests/cmsis_nn_shim.c``, built with host gcc: ``--cflags``, default -O1 as
``tests/test_cortex_m_kernels.py`` builds it), on the same seeded int8 data; the outputs are checked equal byte for byte.
Times are the fastest of ``--repeat`` interleaved runs, single-threaded torch; the column to
read is the ratio (both measured in this one run; other load moves both).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from etforge.plugins.targets import cortex_m_host as K  # noqa: E402

from support import CMSIS_NN, CMSIS_NN_SHIM, _cmsis_nn_sources  # noqa: E402

P8, P32 = ctypes.POINTER(ctypes.c_int8), ctypes.POINTER(ctypes.c_int32)

#: (name, H=W, C in, C out, kernel, stride, depthwise): MobileNetV2-224 layers.
LAYERS = (
    ("stem 3x3/2", 224, 3, 32, 3, 2, False),
    ("dw 3x3/2 (block 2)", 112, 96, 96, 3, 2, True),
    ("expand 1x1 (block 3)", 56, 24, 144, 1, 1, False),
    ("project 1x1 (block 3)", 56, 144, 24, 1, 1, False),
    ("dw 3x3 (block 14)", 7, 960, 960, 3, 1, True),
    ("head 1x1", 7, 320, 1280, 1, 1, False),
)


def build(cflags: str) -> ctypes.CDLL:
    """CMSIS-NN's int8 sources and the test shim as one host shared library (``cflags``)."""
    import subprocess

    if not (CMSIS_NN / "Include" / "arm_nnfunctions.h").is_file():
        sys.exit(f"CMSIS-NN sources not found at {CMSIS_NN} (set ETFORGE_THIRD_PARTY)")
    so = Path(tempfile.mkdtemp(prefix="etforge-bench-cmsis-")) / "libcmsisnn.so"
    cmd = ["gcc", *cflags.split(), "-shared", "-fPIC", "-w", f"-I{CMSIS_NN / 'Include'}", "-DARM_NN_ENABLE_F32=0",
           "-DARM_NN_ENABLE_F16=0", "-o", str(so), *map(str, [*_cmsis_nn_sources(), CMSIS_NN_SHIM]), "-lm"]  # fmt: skip
    subprocess.run(cmd, check=True)
    return ctypes.CDLL(str(so))


def fastest(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def case(lib: ctypes.CDLL, layer: tuple, rng: np.random.Generator, repeat: int) -> tuple[float, float, bool]:
    _, hw, c, o, k, s, dw = layer
    pad = k // 2
    oh = (hw + 2 * pad - k) // s + 1
    x = rng.integers(-128, 128, size=(1, hw, hw, c), dtype=np.int8)
    wt = rng.integers(-128, 128, size=(1, k, k, o) if dw else (o, k, k, c), dtype=np.int8)
    bias = rng.integers(-5000, 5000, size=o).astype(np.int32)
    mult = rng.integers(1 << 30, (1 << 31) - 1, size=o, dtype=np.int64).astype(np.int32)
    shift = rng.integers(-11, 0, size=o).astype(np.int32)
    in_off, out_off = 5, -3
    ref = np.zeros((1, oh, oh, o), np.int8)
    p8, p32 = (lambda a: a.ctypes.data_as(P8)), (lambda a: a.ctypes.data_as(P32))

    def c_call() -> int:
        if dw:
            return lib.shim_dw(p8(x), 1, hw, hw, c, p8(wt), k, k, o, p32(bias), oh, oh, s, s, pad, pad, 1, 1, 1,
                               in_off, out_off, p32(mult), p32(shift), -128, 127, p8(ref))  # fmt: skip
        return lib.shim_conv(p8(x), 1, hw, hw, c, p8(wt), o, k, k, c, p32(bias), oh, oh, s, s, pad, pad, 1, 1,
                             in_off, out_off, p32(mult), p32(shift), -128, 127, p8(ref))  # fmt: skip

    xt = torch.from_numpy(x.copy()).permute(0, 3, 1, 2)
    out = torch.empty((1, o, oh, oh), dtype=torch.int8).contiguous(memory_format=torch.channels_last)
    args = (torch.from_numpy(wt), torch.from_numpy(bias), [s, s], [pad, pad], [1, 1])
    tail = (in_off, out_off, torch.from_numpy(mult), torch.from_numpy(shift), -128, 127, torch.empty(0), out)

    def port() -> object:
        if dw:
            return K.quantized_depthwise_conv2d(xt, *args, 1, *tail)
        return K.quantized_conv2d(xt, *args, *tail)

    assert c_call() == 0
    port()
    same = bool(np.array_equal(K.raw(out).numpy(), ref.reshape(-1)))
    t_port, t_c = float("inf"), float("inf")
    for _ in range(repeat):  # interleaved: load on the machine moves both alike
        t_port = min(t_port, fastest(port, 1))
        t_c = min(t_c, fastest(c_call, 1))
    return t_port, t_c, same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--cflags", default="-O1", help="host gcc flags for CMSIS-NN (e.g. '-O3 -march=native')"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    lib = build(args.cflags)
    print(f"CMSIS-NN for the host ({args.cflags}): built in {time.perf_counter() - start:.1f} s")
    rng = np.random.default_rng(0)
    print(f"{'layer':>24} {'MMACs':>7} {'port ms':>8} {'C ms':>8} {'port/C':>7} {'equal':>6}")
    total_port = total_c = 0.0
    for layer in LAYERS:
        name, hw, c, o, k, s, dw = layer
        oh = (hw + 2 * (k // 2) - k) // s + 1
        macs = oh * oh * o * k * k * (1 if dw else c) / 1e6
        t_port, t_c, same = case(lib, layer, rng, args.repeat)
        total_port, total_c = total_port + t_port, total_c + t_c
        print(
            f"{name:>24} {macs:7.1f} {t_port * 1e3:8.2f} {t_c * 1e3:8.2f} {t_port / t_c:7.2f} {str(same):>6}"
        )
    print(
        f"{'all layers':>24} {'':>7} {total_port * 1e3:8.2f} {total_c * 1e3:8.2f} {total_port / total_c:7.2f}"
    )


if __name__ == "__main__":
    main()
