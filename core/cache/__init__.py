"""The content-addressed build cache and its direct mode (answering before torch is imported)."""
