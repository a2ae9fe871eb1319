"""torch.fx helpers shared by every stage that reads a graph, the layout algebra of stored tensors,
and an ATen graph module made an ``ExportedProgram`` without a re-trace (rewrites, quantize)."""
