"""Sampled kernel windows (torch.profiler over one whole step) and when to take them."""
