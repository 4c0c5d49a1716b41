"""The text report says which rank a signal ended: after a crash, torchrun's agent SIGTERMs the
survivors, and a report that reads them "done" beside the "failed" rank hides who stopped whom."""

from __future__ import annotations

from flowtop.export.textreport import render
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey


def test_a_signal_ended_rank_reads_stopped_with_its_signal() -> None:
    model = make_model()
    keys = [RankKey("j", "node-a", 100 + r, r, 0) for r in range(3)]
    seq = dict.fromkeys(keys, 0)

    def send(key: RankKey, kind: str, fields: dict[str, object], now: float) -> None:
        seq[key] += 1
        model.ingest(wire.decode(wire.encode(kind, key, seq[key], now, fields)), now)

    for key in keys:
        send(key, "hello", {"local_rank": key.rank, "world_size": 3, "device": "cpu (test)", "probe_version": "t"}, 1.0)
    for step in range(1, 6):
        for key in keys:
            send(key, "step", {"step": step, "wall_s": 0.1, "tokens": 8, "drops": 0}, 1.0 + 0.1 * step)
    send(keys[0], "bye", {"reason": "SIGTERM", "steps": 5, "drops": 0}, 2.0)
    send(keys[1], "bye", {"reason": "error: RuntimeError: boom", "steps": 5, "drops": 0}, 2.0)
    send(keys[2], "bye", {"reason": "exit", "steps": 5, "drops": 0}, 2.0)
    lines = render(model.tick(2.5)).splitlines()
    rows = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in ("0", "1", "2")}
    assert rows["0"].endswith("stopped (SIGTERM)")  # "done (SIGTERM)" before: status stopped
    assert rows["1"].endswith("failed (error: RuntimeError: boom)")
    assert rows["2"].endswith("done")
