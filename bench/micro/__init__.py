"""pytest-benchmark micro-benchmarks of the engine's hot paths (not part of ``make test``)."""
