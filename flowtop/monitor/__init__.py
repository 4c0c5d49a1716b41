"""The monitor's data side: sockets, model, accounting, kernels, hints, recordings and
snapshots. Imports neither Textual nor torch, and from the probe only ``probe.wire``;
imports nothing from flowtop's other packages (tests/test_layout.py)."""
