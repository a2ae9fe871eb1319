"""i.MX RT700 targets with the eIQ Neutron-C (N3) NPU.

The limits below were read from the upstream ExecuTorch NXP backend (executorch 1.5.1,
``backends/nxp``); each carries the file it comes from in ``sources``.
"""

from __future__ import annotations

from etforge.core.hookspecs import hookimpl
from etforge.core.target import NpuSpec, OptionSpec, TargetSpec
from etforge.plugins.targets.cortex_m import CPU_OPTIONS, DIM_ORDER_OPTION

_UPSTREAM = "executorch/backends/nxp/backend/ir/converter/node_converters/ops_converters/"

NEUTRON_C = NpuSpec(
    family="neutron-c",
    # MACs per cycle of the RT700's Neutron-C; the SDK's getNeutronTarget("imxrt700").numMacs
    # is authoritative (neutron_target_spec.py reads it from there).
    num_macs=16,
    dtypes=("int8",),
    limits={
        "max_kernel": 4096,
        "max_stride": 4096,
        "max_dilation": 4096,
        "max_weight_rows": 65535,  # kernel_h * kernel_w * ceil(C_in, num_macs)
        "max_transpose_conv_stride": 2,
        "max_softmax_channels": 2040,
        "max_softmax_spatial": 4096,
        "max_softmax_elements": 524288,
        "max_rank": 4,
    },
    fused_activations=("RELU", "RELU6", "RELU_N1_TO_1"),
    compiler="eiq-neutron-sdk",
    sources={
        "max_kernel": _UPSTREAM + "convolution_converter.py (kernelH, kernelW <= 4096)",
        "max_stride": _UPSTREAM + "convolution_converter.py, max_pool2d_with_indices_converter.py",
        "max_dilation": _UPSTREAM + "convolution_converter.py (dilationH, dilationW <= 4096)",
        "max_weight_rows": _UPSTREAM
        + "convolution_converter.py (kernelH*kernelW*ceil(inpC, NUM_MACS) <= 65535)",
        "max_transpose_conv_stride": _UPSTREAM
        + "convolution_converter.py (transposed: stride <= 2, <= kernel)",
        "max_softmax_channels": _UPSTREAM + "softmax_converter.py (channels <= 2040)",
        "max_softmax_spatial": _UPSTREAM + "softmax_converter.py (spatial size <= 4096)",
        "max_softmax_elements": _UPSTREAM + "softmax_converter.py (channels * spatial <= 524288)",
        "fused_activations": "executorch/backends/nxp/backend/neutron_target_spec.py (Relu, Relu6 fusable)",
    },
)

_NPU_OPTIONS = (
    OptionSpec("min_partition_ops", 1, "Smallest number of compute ops worth an NPU partition."),
    OptionSpec("operators_not_to_delegate", (), "Comma-separated Edge op names kept off the NPU."),
    OptionSpec(
        "fetch_constants_to_sram", False, "Neutron: microcode that fetches weights from external memory."
    ),
)

IMXRT700 = TargetSpec(
    name="imxrt700",
    description="i.MX RT700: Neutron-C NPU for what it supports, portable CPU kernels for the rest",
    npu=NEUTRON_C,
    cpu_fallback="portable",
    quant_schemes=("int8",),
    options=_NPU_OPTIONS,
)

IMXRT700CM = TargetSpec(
    name="imxrt700cm",
    description="i.MX RT700: Neutron-C NPU wherever possible, CMSIS-NN on the Cortex-M33 for the rest",
    npu=NEUTRON_C,
    cpu_fallback="cortex_m",
    quant_schemes=("int8",),
    options=(*_NPU_OPTIONS, *CPU_OPTIONS, DIM_ORDER_OPTION),
)


@hookimpl
def etforge_targets() -> list[TargetSpec]:
    return [IMXRT700, IMXRT700CM]
