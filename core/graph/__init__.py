"""torch.fx helpers shared by every stage that reads a graph, and the layout algebra of stored tensors."""
