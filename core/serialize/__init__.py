"""The program's bytes: arena planning, NPU working memory, the ``.pte`` checks and writers."""
