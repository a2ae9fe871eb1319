"""Foundations every stage may use: errors that name their culprit, the fallback log, threads,
quiet third-party output, deferred imports, the process's memory habits, isolated child calls."""
