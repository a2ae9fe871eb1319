"""Run in a child by tests: the SDK double converts a partition, ExecuTorch's NXP backend packs it.

Usage: ``python upstream_payload.py JOBS.json`` where the file holds a list of
``{"tflite": path, "mode": "v0"|"v1", "converted": out path, "payload": out path}``.
Each job converts ``tflite`` with the double (as ExecuTorch's ``NeutronConverterManager``
calls the SDK) and packs the result with upstream's ``PayloadComposer``, every I/O tensor
FORMATLESS (etforge passes tensors in their ExecuTorch dim order). A child, so that the
double and upstream's SDK-dependent modules never enter the test process's ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(jobs_file: str) -> None:
    from ai_edge_litert import schema_py_generated as schema
    from eiq_neutron_sdk import MODE_ENV, neutron_converter
    from executorch.backends.nxp.backend.data_format import DataFormat
    from executorch.backends.nxp.nxp_backend import PayloadComposer

    for job in json.loads(Path(jobs_file).read_text()):
        os.environ[MODE_ENV] = job["mode"]
        tflite = Path(job["tflite"]).read_bytes()
        cctx = neutron_converter.CompilationContext()
        cctx.targetOpts = neutron_converter.getNeutronTarget("imxrt700")
        cctx.compilationOpts.minNumOpsPerGraph = 1
        converted = bytes(neutron_converter.convertModel(list(tflite), cctx))
        graph = schema.ModelT.InitFromPackedBuf(tflite, 0).subgraphs[0]
        names = [graph.tensors[i].name.decode() for i in graph.inputs]
        out_names = [graph.tensors[i].name.decode() for i in graph.outputs]
        io_formats = {
            "inputs": {n: DataFormat.FORMATLESS for n in names},
            "outputs": {n: DataFormat.FORMATLESS for n in out_names},
        }
        Path(job["converted"]).write_bytes(converted)
        Path(job["payload"]).write_bytes(PayloadComposer().get_binary_payload(io_formats, converted))


if __name__ == "__main__":
    main(sys.argv[1])
