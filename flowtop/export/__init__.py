"""What leaves the monitor without a UI: Prometheus/OpenMetrics, JSON lines (``flowtop serve``,
``snapshot --follow``) and the text report. Built on flowtop.monitor only."""
