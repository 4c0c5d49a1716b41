"""Mutated and hostile step frames through the monitor's decode and ingest: a digest of what it made
of them, for two checkouts to agree on (an equivalence check of the step frame's paths).

    python bench/step_fuzz.py [--ranks 64] [--frames 20000] [--seed 0]     # from each checkout's root

``--ranks`` ranks send ``stepcols`` frames of 1 to 512 records (each continuing, or repeating,
overlapping or skipping the rank's steps), with the rank's hellos and FLOP counts among them; about
half the frames are mutated before or after encoding: a column's values made NaN, infinite,
negative, -0.0, huge or out of order, a column cut short, grown, dropped or not bytes, ``n`` off by
one, zero, huge or not an int, the scalars (drops, device time, command counts) of the wrong type
or range, fields added or dropped, the envelope's sequence number repeated or jumping, bytes of the
encoded frame flipped or the frame cut. Each goes through ``decode_frame`` and ``Model.ingest`` as
the collector applies it (a refused frame counted with its reason). The digest hashes every frame's
outcome (applied, or the reason refused), then every rank's state (every ring view, step, drops,
device time, probe and stage samples, sequence numbers, lost frames, command counts), the model's
counts and refusals, and a round of ticks' snapshots. The working directory's code is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from array import array
from typing import Any

sys.path.insert(0, os.getcwd())  # the code version under test: the working directory's

WALL0 = 1.8e9
MONO0 = 1000.0
STEP_S = 0.01
SPECIAL = (float("nan"), float("inf"), -float("inf"), -0.0, -1e-9, 1e7, 1e7 + 1, 2.0**17, 2.0**17 - 1e-9, 5e-324,
           1e300, -1.0)


def _columns(rng: random.Random, first: int, n: int) -> dict[str, Any]:
    """A valid frame's fields: ``n`` records from step ``first``, optional columns at random."""
    fields: dict[str, Any] = {"n": n, "drops": rng.choice([0, 0, 0, rng.randrange(100)]),
                              "step": array("q", range(first, first + n)).tobytes(),
                              "wall_s": array("d", [STEP_S * (1 + 0.02 * rng.random()) for _ in range(n)]).tobytes(),
                              "tokens": array("q", [rng.choice([4096, 0, rng.randrange(1 << 20)]) for _ in range(n)]
                                              ).tobytes()}
    for name in ("input_wait_s", "lead_s", "probe_s", "stage_s"):
        shape = rng.random()
        if shape < 0.7:
            fields[name] = array("d", [STEP_S * rng.random() for _ in range(n)]).tobytes()
        elif shape < 0.85:  # some records without it: NaN
            fields[name] = array("d", [float("nan") if rng.random() < 0.3 else rng.random() for _ in range(n)]).tobytes()
    if rng.random() < 0.8:
        fields["device_s"] = rng.choice([STEP_S * 0.97, 0, 1, 0.5])
    if rng.random() < 0.05:
        fields["commands_refused"] = rng.randrange(5)
    if rng.random() < 0.03:
        fields["commands_dropped"] = rng.randrange(5)
    return fields


def _mutate_value(rng: random.Random, raw: bytes, code: str) -> bytes:
    a = array(code)
    a.frombytes(raw[:len(raw) - len(raw) % 8])
    if not a:
        return raw
    i = rng.randrange(len(a))
    if code == "d":
        a[i] = rng.choice(SPECIAL)
    else:
        a[i] = rng.choice([-1, -(1 << 63), (1 << 63) - 1, a[i] - 1, a[i] + 1, 0, a[i] + (1 << 40),
                           a[i - 1] if i else a[i]])
    if code == "q" and rng.random() < 0.3 and len(a) > 2:  # out of order
        j = rng.randrange(len(a))
        a[i], a[j] = a[j], a[i]
    return a.tobytes()


def _mutate(rng: random.Random, fields: dict[str, Any]) -> None:
    """One mutation of a frame's fields, in place."""
    cols = [k for k in ("step", "wall_s", "tokens", "input_wait_s", "lead_s", "probe_s", "stage_s")
            if type(fields.get(k)) is bytes]
    if not cols:
        return
    what = rng.randrange(9)
    name = rng.choice(cols)
    if what <= 2:
        fields[name] = _mutate_value(rng, fields[name], "q" if name in ("step", "tokens") else "d")
    elif what == 3:
        raw = fields[name]
        fields[name] = rng.choice([raw[:-8], raw + raw[:8], raw[:-1], b"", raw[:len(raw) // 2]])
    elif what == 4:
        fields[name] = rng.choice([None, "text", 7, list(range(3)), bytearray(fields[name]), 1.5])
    elif what == 5:
        n = fields.get("n") if type(fields.get("n")) is int else 1
        fields["n"] = rng.choice([0, -1, n + 1, n - 1, 513, (1 << 64) - 1, "3", 2.0, True, None])
    elif what == 6:
        key = rng.choice(["drops", "device_s", "commands_refused", "commands_dropped"])
        fields[key] = rng.choice([-1, (1 << 64) - 1, "x", None, True, float("nan"), float("inf"), 1e8, 2.5, [1]])
    elif what == 7:
        fields.pop(rng.choice([*cols, "n", "drops"]), None)
    else:
        fields[rng.choice(["extra", "v2", "_sent"])] = rng.choice([1, "x", b"\x00" * 16])


def frames(ranks: int, count: int, seed: int) -> list[tuple[bytes, float]]:
    """The fuzzed stream: (frame, monitor time it arrives)."""
    from probe import wire

    rng = random.Random(seed)
    keys = [wire.RankKey("fuzz", f"node{r // 8}", 100 + r, r, 0) for r in range(ranks)]
    seq, last = [0] * ranks, [0] * ranks
    out: list[tuple[bytes, float]] = []
    t = 0.0
    for i in range(ranks):  # a hello first: a rank the monitor knows
        out.append((wire.encode("hello", keys[i], 0, WALL0, {"local_rank": i % 8, "world_size": ranks,
                                                            "device": "cpu", "probe_version": "0", "argv": []}), MONO0))
        seq[i] = 1
    for _ in range(count):
        i = rng.randrange(ranks)
        n = rng.choice([1, 1, 2, 7, 45, 64, 100, 200, 200, 255, 256, 300, 512])
        shape = rng.random()
        first = last[i] + 1 if shape < 0.7 else max(0, last[i] - rng.randrange(1, 300)) if shape < 0.85 \
            else last[i] + rng.choice([2, 50, 1000, 200_000])
        fields = _columns(rng, first, n)
        mutated = rng.random() < 0.5
        if mutated:
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                _mutate(rng, fields)
        s = seq[i] + (rng.choice([-1, 0, 0, 5, 10_000]) if rng.random() < 0.05 else 0)
        t += rng.choice([0.001, 0.01, 0.5, 2.0])
        try:
            frame = wire.encode("stepcols", keys[i], max(0, s), WALL0 + t, fields)
        except (OverflowError, TypeError, ValueError):  # a mutation msgpack cannot pack: no frame
            continue
        if rng.random() < 0.05:  # the bytes themselves
            b = bytearray(frame)
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            frame = bytes(b[:rng.randrange(len(b))]) if rng.random() < 0.3 else bytes(b)
        seq[i] += 1
        if not mutated:
            last[i] = max(last[i], first + n - 1)
        out.append((frame, MONO0 + t))
    return out


def rank_state(st: Any) -> tuple[Any, ...]:
    ring = st.steps
    views = tuple(tuple(ring.column(c)) for c in range(7)) if ring else ()
    return (repr(st.key), st.step, st.drops, st.device_s, tuple(st.probe_s), tuple(st.stage_s), st.last_seq, st.lost,
            st.commands_refused, st.commands_dropped, len(ring), ring.recent_len, views,
            tuple(tuple(v) for v in ring.history_columns(120)) if ring else (), ring.nbytes, st.last_recv, st.version)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--frames", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from flowtop.monitor import collector as C
    from flowtop.monitor.clock import MonitorClock
    from flowtop.monitor.rankkernels import decode_frame
    from flowtop.monitor.snapshot_json import to_json
    from flowtop.monitor.wiring import make_model
    from probe import wire

    now = [MONO0]
    model = make_model()
    model.offload_kernels(lambda key, window: None)
    col = C.Collector(model, clock=MonitorClock(raw=lambda: now[0]))
    h = hashlib.sha256()
    outcomes: dict[str, int] = {}
    for frame, at in frames(args.ranks, args.frames, args.seed):
        now[0] = at
        col._frame_at = at
        try:
            msg = decode_frame(frame, model.builds_kernels, model.knows, col._kernel_budget)
        except wire.WireError as exc:
            model.reject(str(exc))
            why = str(exc)
        else:
            rejected = model.rejected
            model.ingest(msg, at, None)
            why = "rejected" if model.rejected != rejected else "ok"
        h.update(why.encode() + b"\n")
        outcomes[why[:60]] = outcomes.get(why[:60], 0) + 1
    for key in sorted(model.ranks, key=repr):
        h.update(repr(rank_state(model.ranks[key])).encode())
    h.update(repr((sorted(model.rejected_reasons.items()), model.received, model.rejected)).encode())
    for k in range(max(1, model.spread)):
        snap = model.tick(now[0] + 0.5 * k, "fuzz")
        h.update(json.dumps(to_json(snap), sort_keys=True, default=repr).encode())
    print(json.dumps({"frames": args.frames, "received": model.received, "rejected": model.rejected,
                      "outcomes": len(outcomes), "ok": outcomes.get("ok", 0), "digest": h.hexdigest()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
