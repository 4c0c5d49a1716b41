"""Equivalence of a monitor change around node relays coming back: every tick's JSON snapshot, digested.

Drives one Model (flowtop.monitor.wiring.make_model) with real wire frames and relay stamps:
job "j" of 8 ranks (ranks 4-7 behind node-b's relay, which falls silent and comes back at seeded
random times, from 1 to 8 s, and is replaced by a new relay id now and then) and job "d" of 4
ranks heard directly; a tick every 0.5 s for ``--seconds``, at RANKS_PER_TICK 512 (one tick a
round) and 2 (4 ticks a round: the rules in shares). Per tick it writes the digest of the JSON
snapshot as it is, and of the JSON without relay_silent hints, and whether a rank is cut off.

    PYTHONPATH=TREE python bench/relay_return_equiv.py --out /tmp/x.jsonl
    python bench/relay_return_equiv.py --compare /tmp/base.jsonl /tmp/new.jsonl

``--compare`` says at how many ticks the two runs' snapshots differ, and fails unless, at every
one, they are the same without relay_silent hints and the second run's differs only in showing
none while no rank of the job is cut off (the base's held it) or, with the rules in shares, in
raising a new cut at its share's tick where the base still showed the last one's. (Written for
relay_silent's clearing at the first tick, reverted in 785e3bf: it flapped; the per-tick digests
serve any change around a relay's return, ``--compare``'s rule that one's.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from typing import Any


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run(seconds: float, ranks_per_tick: int, seed: int) -> list[dict[str, Any]]:
    from flowtop.monitor import rotation
    from flowtop.monitor.relays import encode_stamp
    from flowtop.monitor.snapshot_json import to_json
    from flowtop.monitor.wiring import make_model
    from probe import wire
    from probe.wire import RankKey

    rotation.RANKS_PER_TICK = ranks_per_tick
    rng = random.Random(seed)
    model = make_model()
    keys = [RankKey("j", "node-a" if r < 4 else "node-b", 100 + r, r, 0) for r in range(8)]
    keys += [RankKey("d", "node-c", 200 + r, r, 0) for r in range(4)]
    seq = {k: 0 for k in keys}
    steps = {k: 0 for k in keys}
    now, relay, up, switch_at, n, out = 10.0, "node-b:7:1", True, 10.0 + rng.uniform(2, 8), 0, []

    def send(k: RankKey, kind: str, fields: dict[str, Any]) -> None:
        seq[k] += 1
        frame = wire.encode(kind, k, seq[k], now, fields)
        if k.host != "node-b":
            model.ingest(wire.decode(frame), now)
        elif up:
            via, (at,) = model.relays.unstamp([encode_stamp(relay, now + 900.0, [0]), frame], now)
            model.ingest(wire.decode(frame), at, via=via)

    for k in keys:
        send(k, "hello", {"local_rank": k.rank % 4, "world_size": 8 if k.job == "j" else 4, "device": "cpu (bench)",
                          "probe_version": "bench"})
    while now < 10.0 + seconds:
        now += 0.05
        n += 1
        if now >= switch_at:
            up = not up
            if up and rng.random() < 0.3:
                relay = f"node-b:{rng.randrange(8, 99)}:{rng.getrandbits(16):x}"  # a successor
            switch_at = now + rng.uniform(1.0, 8.0)
        for k in keys:
            if n % (1 + k.rank % 2) == 0:
                steps[k] += 1
                send(k, "step", {"step": steps[k], "wall_s": 0.05, "tokens": 256, "drops": 0})
        if n % 10 == 0:
            data = to_json(model.tick(now))
            (job,) = [j for j in data["jobs"] if j["job"] == "j"]
            shown = any(h["id"] == "relay_silent" and not h["ended"] for h in job["hints"])
            whole = _digest(data)
            for j in data["jobs"]:
                j["hints"] = [h for h in j["hints"] if h["id"] != "relay_silent"]
            out.append({"t": round(now, 2), "all": whole, "rest": _digest(data), "cut": job["unheard_ranks"],
                        "shown": shown})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--compare", nargs=2)
    a = ap.parse_args()
    if a.compare:
        base, new = ([json.loads(line) for line in open(p)] for p in a.compare)
        assert len(base) == len(new), (len(base), len(new))
        differ = [(b, x) for b, x in zip(base, new) if b != x]
        # the hint gone where no rank is cut off (its clearing); cut off anew while the base
        # still held the last one: raised at its share's tick, as a first cut is (RANKS_PER_TICK 2)
        cleared = [(b, x) for b, x in differ if b["shown"] and not b["cut"] and not x["shown"]]
        anew = [(b, x) for b, x in differ if b["cut"] and b["shown"] and not x["shown"]]
        bad = [(b, x) for b, x in differ if b["rest"] != x["rest"] or b["cut"] != x["cut"]
               or (x["shown"] and not x["cut"]) or ((b, x) not in cleared and (b, x) not in anew)]
        print(f"{len(base)} ticks, {len(differ)} differ: {len(cleared)} relay_silent cleared with no rank cut, "
              f"{len(anew)} a new cut before its share's tick, {len(bad)} other")
        return 1 if bad else 0
    with open(a.out, "w") as f:
        for rpt in (512, 2):
            for row in run(a.seconds, rpt, seed=rpt):
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
