"""A host target: every convertible op goes to LiteRT partitions (int8 or float32).

Useful for checking converters and for running the LiteRT side of a model on a PC.
"""

from __future__ import annotations

from etforge.sdk import NpuSpec, OptionSpec, TargetSpec, hookimpl

LITERT = TargetSpec(
    name="litert",
    description="Host LiteRT: every op a converter accepts, int8 or float32, runs in LiteRT partitions",
    npu=NpuSpec(
        family="litert",
        num_macs=1,
        dtypes=("int8", "float32"),
        fused_activations=("RELU", "RELU6", "RELU_N1_TO_1", "TANH"),
        takes_undeclared_converters=True,  # checks any converter, however it names its NPUs
    ),
    cpu_fallback="portable",
    options=(
        OptionSpec("min_partition_ops", 1, "Smallest number of compute ops worth a partition.", minimum=1),
        OptionSpec("operators_not_to_delegate", (), "Comma-separated Edge op names kept off LiteRT."),
    ),
)


@hookimpl
def etforge_targets() -> list[TargetSpec]:
    return [LITERT]
