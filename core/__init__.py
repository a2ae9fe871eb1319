"""The plugin-agnostic core: it names no op and no chip.

One package per stage, listed in :data:`STAGES` in import order: a stage imports only from the
stages before it (``tests/test_layers.py`` walks every module to hold that line). Imports under
``if TYPE_CHECKING:`` are annotations only and may point either way.

=========== ============================================================================
common      errors, the fallback log, threads, quiet output, deferred imports
graph       torch.fx helpers, the layout algebra, a graph module as a program
contracts   the plugin API: hookspecs and the contracts hooks return
registry    plugins found through entry points, checked; target options
litert      the LiteRT builder, one partition's conversion, the delegate payload
front       load, signature, in-place ops made functional, ``torch.export``
quantize    the PT2E quantizer composed from rule plugins, calibration, conversion
lower       partitions (early or classic), the NPU backend, CPU kernels
serialize   arena and NPU memory plans, ``.pte`` checks and writers
build       one compile: stages in order, report, summary, output directory
cache       the content-addressed build cache and its direct mode
batch       many compiles in worker processes
=========== ============================================================================
"""

STAGES: tuple[str, ...] = (
    "common",
    "graph",
    "contracts",
    "registry",
    "litert",
    "front",
    "quantize",
    "lower",
    "serialize",
    "build",
    "cache",
    "batch",
)
