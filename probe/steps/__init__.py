"""The training loop seen from inside: step boundaries and timing, pipeline stages and the
rank's parallel coordinates."""
