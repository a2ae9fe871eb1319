"""i.MX RT700 targets with the eIQ Neutron-C (N3) NPU.

The limits and requirements below re-express the checks of the upstream ExecuTorch NXP
backend (executorch 1.5.1, ``backends/nxp``) as data; each carries the file it comes from
in ``sources``. The op converters in ``plugins/ops`` enforce them (docs/targets.md,
"Neutron constraint parity", maps each upstream condition to its check and test). Figures
that are not NXP data are listed in ``assumptions`` and, with the eIQ Neutron SDK
installed, read from it instead (``probe``).
"""

from __future__ import annotations

from etforge.plugins.targets import tflm_arena
from etforge.plugins.targets.cortex_m import CPU_OPTIONS, DIM_ORDER_OPTION
from etforge.sdk import NpuSpec, OptionSpec, PartitionCheck, TargetSpec, hookimpl

_UPSTREAM = "executorch/backends/nxp/backend/ir/converter/node_converters/ops_converters/"
_NODE_CONVERTER = "executorch/backends/nxp/backend/ir/converter/node_converter.py"

#: Every name a Neutron spec may carry and what it means (``NpuSpec.declares``): a target for
#: another Neutron chip is checked against this list when it loads. docs/writing-a-target-
#: plugin.md explains each; the converter or hook named in brackets enforces it.
DECLARES: dict[str, str] = {
    # limits (integers)
    "max_kernel": "largest conv / pool kernel side (conv, avg_pool, adaptive_avg_pool)",
    "max_stride": "largest conv / avg-pool stride (conv, avg_pool, adaptive_avg_pool)",
    "max_dilation": "largest conv dilation (conv)",
    "max_weight_rows": "kernel_h * kernel_w * ceil(C_in, num_macs) bound of a conv's weight buffer (conv)",
    "max_transpose_conv_stride": "largest transposed-conv stride (conv)",
    "max_max_pool_stride": "largest max-pool stride (max_pool)",
    "max_softmax_channels": "largest softmax dim size (softmax)",
    "max_softmax_spatial": "largest product of a softmax's other dims (softmax)",
    "max_softmax_elements": "largest softmax tensor (softmax)",
    "max_view_rank": "largest reshape output rank (view)",
    "max_split_groups": "grouped convs with 2 to this many groups (not depthwise) are split into "
    "single-group convs and a cat; more groups run as one grouped conv (grouped_conv rewrite, conv)",
    "max_rank": "largest tensor rank of data-movement ops without a rank limit of their own (shape ops)",
    "max_tensor_rank": "largest rank of any tensor a node on the NPU reads or writes (partition check)",
    # choices (allowed values)
    "resize_scales": "integer up-sampling factors (upsample_nearest2d, upsample_bilinear2d)",
    "batch_matmul_zero_points": "input zero points a bmm may have (bmm)",
    "hw_versions": "Neutron hardware versions the converters target; the SDK reports the chip's (SDK hook)",
    # requires (flags)
    "binary_full_size_operand": "add/sub/mul/max/min: one input as large as the output (elementwise)",
    "conv_plain_or_depthwise": "the NPU runs regular and depthwise convs: grouped convs within "
    "max_split_groups are split (grouped_conv rewrite) and refused whole (conv)",
    "avg_pool_counts_padding": "avg_pool with padding only when padding counts (avg_pool)",
    "clamp_needs_a_bound": "clamp with at least one finite bound (clamp)",
    "clamp_shared_qparams_unless_relu": "clamp/hardtanh other than ReLU/ReLU6 keep their input qparams (clamp)",
    "shared_qparams_cat": "cat inputs and output share qparams (cat)",
    "shared_qparams_minmax": "maximum/minimum inputs and output share qparams (elementwise)",
    "shared_qparams_pad": "constant pad input and output share qparams (pad)",
    "shared_qparams_permute": "permute input and output share qparams (permute)",
    "shared_qparams_pool": "pool input and output share qparams (max_pool, avg_pool)",
    "shared_qparams_reduce": "mean/sum input and output share qparams (mean, sum)",
    "neg_per_tensor": "neg only on per-tensor quantized input (neg)",
    "matmul_constant_rhs": "mm/addmm right operand a constant (linear)",
    "addmm_bias_row": "addmm bias a row ([P] or [1, P]) (linear)",
    "slice_unit_step": "slices of step 1 only (slice)",
    "slice_nonempty": "no empty slice (slice)",
    "partition_needs_compute": "no partition of no-ops only (partition check)",
    "clone_boundary_dim_orders": "a clone at a partition boundary sees a contiguous or channels-last "
    "tensor (partition check)",
    "not_subsystem": "the chip's Neutron is not a Neutron-S subsystem; the SDK reports it (SDK hook)",
}

NEUTRON_C = NpuSpec(
    fallback_arena=tflm_arena.arena_bytes,
    fallback_arena_note=tflm_arena.NOTE,
    family="neutron-c",
    num_macs=16,
    dtypes=("int8",),
    limits={
        "max_kernel": 4096,
        "max_stride": 4096,
        "max_dilation": 4096,
        "max_weight_rows": 65535,  # kernel_h * kernel_w * ceil(C_in, num_macs)
        "max_transpose_conv_stride": 2,
        "max_max_pool_stride": 4096,
        "max_softmax_channels": 2040,
        "max_softmax_spatial": 4096,  # N * H * W (every dim but the softmax dim)
        "max_softmax_elements": 524288,
        "max_view_rank": 7,
        "max_split_groups": 10,
        "max_tensor_rank": 7,
    },
    choices={
        "resize_scales": (1, 2, 4, 8),
        "batch_matmul_zero_points": (0,),
        "hw_versions": (2,),
    },
    requires=(
        "binary_full_size_operand",
        "conv_plain_or_depthwise",
        "avg_pool_counts_padding",
        "clamp_needs_a_bound",
        "clamp_shared_qparams_unless_relu",
        "shared_qparams_cat",
        "shared_qparams_minmax",
        "shared_qparams_pad",
        "shared_qparams_permute",
        "shared_qparams_pool",
        "shared_qparams_reduce",
        "neg_per_tensor",
        "matmul_constant_rhs",
        "addmm_bias_row",
        "slice_unit_step",
        "slice_nonempty",
        "partition_needs_compute",
        "clone_boundary_dim_orders",
        "not_subsystem",
    ),
    fused_activations=("RELU", "RELU6", "RELU_N1_TO_1"),
    compiler="eiq-neutron-sdk",
    assumptions={
        "num_macs": "placeholder, not NXP data; the eIQ Neutron SDK's getNeutronTarget('imxrt700') "
        "gives the real value (read automatically when the SDK is installed)",
    },
    probe="etforge.plugins.targets.neutron_spec_sdk:read_figures",
    device="imxrt700",
    sources={
        "num_macs": "executorch/backends/nxp/backend/neutron_target_spec.py reads it from the SDK",
        "max_kernel": _UPSTREAM
        + "convolution_converter.py, avg_pool_2d_converter.py, adaptive_avg_pool_2d_converter.py (<= 4096)",
        "max_stride": _UPSTREAM
        + "convolution_converter.py, avg_pool_2d_converter.py, adaptive_avg_pool_2d_converter.py (<= 4096)",
        "max_dilation": _UPSTREAM + "convolution_converter.py (dilationH, dilationW <= 4096)",
        "max_weight_rows": _UPSTREAM
        + "convolution_converter.py (kernelH*kernelW*ceil(inpC, NUM_MACS) <= 65535)",
        "max_transpose_conv_stride": _UPSTREAM
        + "convolution_converter.py (transposed: stride <= 2, <= kernel, padding < kernel)",
        "max_max_pool_stride": _UPSTREAM + "max_pool2d_with_indices_converter.py (stride <= 4096)",
        "max_softmax_channels": _UPSTREAM + "softmax_converter.py (channels <= 2040)",
        "max_softmax_spatial": _UPSTREAM + "softmax_converter.py (N*H*W <= 4096)",
        "max_softmax_elements": _UPSTREAM + "softmax_converter.py (channels * N*H*W <= 524288)",
        "max_view_rank": _UPSTREAM + "view_copy_converter.py (output rank < 8)",
        "max_tensor_rank": _UPSTREAM + "view_copy_converter.py (tensor_rank(y) >= 8 refused: the backend's "
        "only rank bound, the most dims a tensor it builds has); a node with a rank-8 tensor stays on the CPU",
        "resize_scales": _UPSTREAM + "upsample_nearest2d_converter.py, upsample_bilinear2d_converter.py "
        "(align_corners: (out - 1) / (in - 1), input H, W > 1)",
        "batch_matmul_zero_points": _UPSTREAM + "bmm_converter.py (both input zero points 0)",
        "binary_full_size_operand": _NODE_CONVERTER + " inputs_satisfy_broadcast_condition "
        "(add, sub, mul, maximum, minimum, prelu)",
        "conv_plain_or_depthwise": "executorch/backends/nxp/aten_passes/split_group_convolution.py "
        "(the NPU runs regular and depthwise convolutions only; groups 2-10 split), "
        + _UPSTREAM
        + "convolution_converter.py (other grouped convs converted as a grouped Conv2D)",
        "max_split_groups": _UPSTREAM.replace("ops_converters/", "shared/conv_utils.py")
        + " (group_conv_convertible_into_multiple_convolutions: 2 <= group <= 10)",
        "avg_pool_counts_padding": _UPSTREAM
        + "avg_pool_2d_converter.py (count_include_pad=False: no padding)",
        "clamp_needs_a_bound": _UPSTREAM + "clamp_converter.py (some bound finite)",
        "clamp_shared_qparams_unless_relu": _UPSTREAM + "clamp_converter.py, hardtanh_converter.py",
        "shared_qparams_cat": _UPSTREAM + "cat_converter.py",
        "shared_qparams_minmax": _UPSTREAM + "maximum_converter.py, minimum_converter.py",
        "shared_qparams_pad": _UPSTREAM + "constant_pad_nd_converter.py",
        "shared_qparams_permute": _UPSTREAM + "permute_copy_converter.py",
        "shared_qparams_pool": _UPSTREAM
        + "max_pool2d_with_indices_converter.py, avg_pool_2d_converter.py, adaptive_avg_pool_2d_converter.py",
        "shared_qparams_reduce": _UPSTREAM + "mean_dim_converter.py, sum_dim_int_list_converter.py",
        "neg_per_tensor": _UPSTREAM + "neg_converter.py",
        "matmul_constant_rhs": _UPSTREAM + "mm_converter.py (weights static)",
        "addmm_bias_row": _UPSTREAM + "addmm_converter.py (bias [P] or [1, P])",
        "slice_unit_step": _UPSTREAM + "slice_copy_tensor_converter.py (4 args: no step)",
        "slice_nonempty": _UPSTREAM + "slice_copy_tensor_converter.py (start < end)",
        "fused_activations": "executorch/backends/nxp/backend/neutron_target_spec.py (Relu, Relu6 fusable)",
        "partition_needs_compute": "executorch/backends/nxp/neutron_partitioner.py "
        "(validate_partitioning_result: no partition of no-ops only), backend/edge_helper.py "
        "(is_no_op_on_neutron), and the supports_partitioning_result of the clone, permute_copy, "
        "upsample_nearest2d, upsample_bilinear2d, mean_dim, clamp and relu converters",
        "clone_boundary_dim_orders": _UPSTREAM
        + "clone_converter.py (a clone at a partition boundary: contiguous or channels-last)",
        "hw_versions": "executorch/backends/nxp/backend/neutron_target_spec.py (NeutronHWVersion.N3 = 2 only)",
        "not_subsystem": "executorch/backends/nxp/backend/neutron_target_spec.py "
        "(is_subsystem(): Neutron-S targets refused)",
    },
    declares=DECLARES,
)

NPU_OPTIONS = (
    OptionSpec("min_partition_ops", 1, "Smallest number of compute ops worth an NPU partition.", minimum=1),
    OptionSpec("operators_not_to_delegate", (), "Comma-separated Edge op names kept off the NPU."),
    OptionSpec(
        "fetch_constants_to_sram", False, "Neutron: microcode that fetches weights from external memory."
    ),
    OptionSpec(
        "npu_timeout",
        3600,
        "Seconds the eIQ Neutron SDK may take per partition before it is killed.",
        affects_output=False,
        minimum=1,
    ),
)

IMXRT700 = TargetSpec(
    name="imxrt700",
    description="i.MX RT700: Neutron-C NPU for what it supports, portable CPU kernels for the rest",
    npu=NEUTRON_C,
    cpu_fallback="portable",
    cpu="cortex-m33",
    quant_schemes=("neutron", "int8"),
    options=NPU_OPTIONS,
)

IMXRT700CM = TargetSpec(
    name="imxrt700cm",
    description="i.MX RT700: Neutron-C NPU wherever possible, CMSIS-NN on the Cortex-M33 for the rest",
    npu=NEUTRON_C,
    cpu_fallback="cortex_m",
    cpu="cortex-m33",
    quant_schemes=("neutron", "int8"),
    options=(*NPU_OPTIONS, *CPU_OPTIONS, DIM_ORDER_OPTION),
)


@hookimpl
def etforge_targets() -> list[TargetSpec]:
    return [IMXRT700, IMXRT700CM]


@hookimpl
def etforge_partition_checks() -> list[PartitionCheck]:
    from etforge.plugins.targets.neutron_checks import CloneBoundaryDimOrder, NeedsCompute, TensorRank

    return [CloneBoundaryDimOrder(), NeedsCompute(), TensorRank()]
