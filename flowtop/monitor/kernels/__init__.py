"""Kernel windows on the monitor side: format, Chrome-trace loader, FLOP formulas, aggregation.

Pure Python (no torch, no textual): ``flowtop analyze`` and the live monitor both use it.

* :mod:`flowtop.monitor.kernels.trace` — the compact window format (spec in its docstring), built by
  one builder from the probe's raw records (wire decode) or from a torch.profiler Chrome trace;
* :mod:`flowtop.monitor.kernels.opflops` — FLOPs of an operator call from its name and input shapes;
* :mod:`flowtop.monitor.kernels.classify` — kernel/operator categories and short display names;
* :mod:`flowtop.monitor.kernels.aggregate` — top list, step anatomy, rank merge, cumulative table.
"""
