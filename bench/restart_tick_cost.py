"""The model's ticks after a restart, in instructions: N ranks (argv[1]) of one job step 3 times,
say bye (SIGTERM), N new processes (incarnation 1, new pids) start; the 3 ticks of their first
steps are counted (inside itertools.starmap: callgrind's toggle). The first of them sees a new set
of processes with every rank number held twice (claims.ClaimedAt walks them, the view's order is
sorted again). Compare a branch with its base from each checkout's root::

    PYTHONHASHSEED=0 PYTHONPATH=. valgrind --tool=callgrind --callgrind-out-file=/tmp/t.cg \
        --toggle-collect=starmap_next $(python -c 'import sys; print(sys.executable)') bench/restart_tick_cost.py 1024
    callgrind_annotate /tmp/t.cg | grep "PROGRAM TOTALS"
"""

from __future__ import annotations

import itertools
import sys

from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey
N = int(sys.argv[1])
m = make_model()
now = 1000.0
seq: dict[RankKey, int] = {}


def send(k: RankKey, kind: str, f: dict[str, object]) -> None:
    s = seq.get(k, 0)
    seq[k] = s + 1
    m.ingest(wire.decode(wire.encode(kind, k, s, now, f)), now)


def start(inc: int, pid0: int) -> list[RankKey]:
    ks = [RankKey("j", f"h{r // 8}", pid0 + r, r, inc) for r in range(N)]
    for k in ks:
        send(k, "hello", {"local_rank": k.rank % 8, "world_size": N, "device": "cpu (test)", "probe_version": "t"})
    return ks


old = start(0, 100000)
for step in range(1, 4):
    now += 0.5
    for k in old:
        send(k, "step", {"step": step, "wall_s": 0.5, "tokens": 64, "drops": 0})
    m.tick(now)
now += 0.1
for k in old:
    send(k, "bye", {"reason": "SIGTERM", "steps": 3, "drops": 0})
m.tick(now)
now += 2.0
new = start(1, 200000)
ticks = []
for step in range(1, 4):
    now += 0.5
    for k in new:
        send(k, "step", {"step": step, "wall_s": 0.5, "tokens": 64, "drops": 0})
    ticks.append(now)
list(itertools.starmap(m.tick, [(t,) for t in ticks]))
