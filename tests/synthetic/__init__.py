"""Made-up snapshots for tests and benchmarks (not shipped: the figures are invented)."""
