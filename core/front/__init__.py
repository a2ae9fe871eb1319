"""The front end: load a model, check its signature, make in-place ops functional, ``torch.export``."""
