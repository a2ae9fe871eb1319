"""An etforge plugin in one file: an extra op converter, its quantizer rule, and a toy target."""

from etforge.sdk import NpuSpec, OpConverter, QuantRule, TargetSpec, elementwise, hookimpl


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [
        elementwise(
            "aten.floor.default", "FLOOR", dtypes=("float32",), name="Floor", targets=("toy", "litert")
        )
    ]


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    return [QuantRule(ops=("aten.floor.default",), kind="shared")]


@hookimpl
def etforge_targets() -> list[TargetSpec]:
    return [
        TargetSpec(
            name="toy-npu",
            description="A toy float NPU that runs LiteRT partitions",
            npu=NpuSpec(family="toy", dtypes=("float32", "int8")),
        )
    ]
