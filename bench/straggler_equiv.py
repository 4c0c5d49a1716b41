"""The straggler measure's figures on random jobs, normalized to the base's evidence keys, so two
code versions that should measure the same can be compared line by line.

    cd CHECKOUT && PYTHONPATH=CHECKOUT:CHECKOUT/tests python /path/to/bench/straggler_equiv.py \\
        --jobs 3000 --seed 0 > /tmp/straggler-CHECKOUT.txt
    diff /tmp/straggler-BASE.txt /tmp/straggler-MINE.txt; tail -1 each (a SHA-256 of the lines)

(the working directory's ``flowtop`` and its tests' factories are imported). Each job: 2-12
ranks, 25-300 steps each (some ranks a few steps behind), per-rank step times around a job-wide
one with jitter, a straggler now and then by step time, by pace alone (its steps reach the
monitor slower than its step times say) or by lead, steps received in frames of 1-40 steps
(a frame's steps share its receive time). Per rank measured: one line of its measurement (value,
impact, step, steps covered, evidence, text, variant), the evidence keys as the base wrote them
(a pace as ``step_time_s``: commit "straggler hint says what it measured" moved it to
``pace_s_per_step``, its variant "pace" to "").

``--tick-cost RANKS``: instead, bench/tick_cost.py's run (8 measured ticks; its straggler, the
ending node, the ended 16-rank job), each tick's JSON snapshot printed as the base wrote it:
schema 1.14's ``ended_at`` and ``first_ending`` printed apart (``ended`` lines), the version
and every straggler hint's ``summary`` left out, its evidence in the base's keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import random
import sys
from typing import Any

sys.path.insert(0, os.getcwd())
sys.path.insert(1, os.path.join(os.getcwd(), "tests"))


def _job(rng: random.Random) -> Any:
    from flowtop.monitor.snapshot import History
    from test_hints_factories import job, rank

    n_ranks = rng.randint(2, 12)
    step_s = rng.choice((0.01, 0.05, 0.1, 0.3))
    n = rng.randint(25, 300)
    slow, kind = rng.randrange(n_ranks), rng.choice(("none", "step", "pace", "lead"))
    factor = 1.0 + rng.choice((0.0, 0.03, 0.08, 0.12, 0.3, 1.0))
    ranks = []
    for r in range(n_ranks):
        behind = rng.choice((0, 0, 0, 1, 3))
        mine = step_s * (factor if r == slow and kind == "step" else 1.0) * (1 + rng.uniform(-0.02, 0.02))
        times = [max(1e-4, mine * (1 + rng.gauss(0, 0.05))) for _ in range(n - behind)]
        pace = factor if r == slow and kind == "pace" else 1.0
        t, reached, s = 0.0, [], 1
        frame = rng.randint(1, 40)
        while s <= len(times):
            last = min(s + frame - 1, len(times))
            t += sum(times[s - 1:last]) * pace
            reached += [(k, t) for k in range(s, last + 1)]
            s = last + 1
        lead = 0.0 if rng.random() < 0.3 else 0.01 + (0.02 * factor if r == slow and kind == "lead" else 0.0)
        steps = tuple(range(1, len(times) + 1))
        h = History(steps=steps, step_time_s=tuple(times), input_wait_s=(0.0,) * len(times),
                    lead_s=tuple(lead * (1 + rng.uniform(-0.1, 0.1)) for _ in times), reached=tuple(reached))
        ranks.append(rank(r, step=len(times), hist=h))
    return job(*ranks)


def _line(target: str, m: Any) -> str:
    if m is None:
        return f"{target} None"
    ev = dict(m.evidence)
    variant = m.variant
    if ev.get("basis") == "pace" and "pace_s_per_step" in ev:  # the base's keys
        ev["step_time_s"], ev["others_step_time_s"] = ev.pop("pace_s_per_step"), ev.pop("others_pace_s_per_step")
        ev.pop("pace_steps"), ev.pop("pace_span_s")
        variant = ""
    fields = dataclasses.asdict(m) if dataclasses.is_dataclass(m) else m._asdict()
    fields.update(evidence=sorted(ev.items()), variant=variant, text=sorted(m.text.items()))
    return f"{target} {sorted(fields.items())!r}"


def _base_hint(h: dict[str, Any]) -> dict[str, Any]:
    if h["id"] != "straggler":
        return h
    ev = dict(h["evidence"])
    if ev.get("basis") == "pace" and "pace_s_per_step" in ev:
        ev["step_time_s"], ev["others_step_time_s"] = ev.pop("pace_s_per_step"), ev.pop("others_pace_s_per_step")
        ev.pop("pace_steps"), ev.pop("pace_span_s")
    return {**h, "summary": None, "evidence": ev}


def _tick_cost(ranks: int) -> None:
    import json

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tick_cost as T

    from flowtop.monitor.snapshot_json import to_json

    sys.path.insert(0, os.getcwd())
    model, ticker, sim, jobs = T.build(ranks, 8, 24, 0)
    h = hashlib.sha256()
    for k in range(8):
        sim.now = T.T0 + (24 + 1 + k) * T.TICK_S
        T.events(sim, jobs, k)
        for job in jobs:
            sim.between(job, 24 + 1 + k)
        data = to_json(ticker.catch_up(sim.now), with_kernels=False)
        data.pop("schema")
        for j in data["jobs"]:
            ended = [(r["rank"], r.pop("ended_at", "absent")) for r in j["ranks"]]
            print(k, "ended", j["job"], j.pop("first_ending", "absent"), [e for e in ended if e[1] is not None])
            j["hints"] = [_base_hint(x) for x in j["hints"]]
        line = json.dumps(data, sort_keys=True)
        h.update(line.encode())
        print(k, "json", hashlib.sha256(line.encode()).hexdigest())
    print("digest", h.hexdigest())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tick-cost", type=int, default=0, metavar="RANKS")
    args = ap.parse_args()
    if args.tick_cost:
        _tick_cost(args.tick_cost)
        return 0
    from flowtop.monitor.hints.measures_straggler import straggler
    from flowtop.monitor.hints.rules import RULES_BY_ID

    rule = RULES_BY_ID["straggler"]
    rng = random.Random(args.seed)
    h = hashlib.sha256()
    for i in range(args.jobs):
        for target, m in sorted(straggler(rule, _job(rng), 0.0).items()):
            line = f"{i} {_line(target, m)}"
            h.update(line.encode())
            print(line)
    print("digest", h.hexdigest())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
