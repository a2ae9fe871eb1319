"""Host execution of compiled programs (LiteRT for NPU partitions) and firmware glue."""
