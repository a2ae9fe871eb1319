"""Run in a child by tests: the SDK double converts a partition, ExecuTorch's NXP backend packs it.

Usage: ``python upstream_payload.py JOBS.json`` where the file holds a list of
``{"tflite": path, "mode": "v0"|"v1", "converted": out path, "payload": out path}`` and,
optionally, ``"target"`` (default ``imxrt700``) and ``"channels_last"`` (names of graph I/O
tensors upstream's format inference would call CHANNELS_LAST; the rest are FORMATLESS).
Each job converts ``tflite`` through upstream's own ``NeutronConverterManager`` (so with the
compilation options upstream always passes) and packs the result with upstream's
``PayloadComposer``. A child, so that the double and upstream's SDK-dependent modules never
enter the test process's ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(jobs_file: str) -> None:
    from ai_edge_litert import schema_py_generated as schema
    from eiq_neutron_sdk import MODE_ENV
    from executorch.backends.nxp.backend.data_format import DataFormat
    from executorch.backends.nxp.backend.neutron_converter_manager import NeutronConverterManager
    from executorch.backends.nxp.nxp_backend import PayloadComposer

    for job in json.loads(Path(jobs_file).read_text()):
        os.environ[MODE_ENV] = job["mode"]
        tflite = Path(job["tflite"]).read_bytes()
        converted = NeutronConverterManager().convert(tflite, job.get("target", "imxrt700"), "partition")
        graph = schema.ModelT.InitFromPackedBuf(tflite, 0).subgraphs[0]
        last = set(job.get("channels_last", ()))
        io_formats = {
            side: {
                n: DataFormat.CHANNELS_LAST if n in last else DataFormat.FORMATLESS
                for n in (graph.tensors[i].name.decode() for i in indices)
            }
            for side, indices in (("inputs", graph.inputs), ("outputs", graph.outputs))
        }
        Path(job["converted"]).write_bytes(bytes(converted))
        Path(job["payload"]).write_bytes(PayloadComposer().get_binary_payload(io_formats, converted))


if __name__ == "__main__":
    main(sys.argv[1])
