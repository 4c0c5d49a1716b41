"""FLOPs on sampled steps: the counter and its formulas, the sampling policy, the estimate,
peaks and precision, and the ``flops`` message."""
