#!/usr/bin/env python
"""What one frame costs the bounded read of a peer's upstream socket: probe.wire.command_bound's
read_commands (one helper for a probe's link and a relay) against the loop the link had inline.

    python bench/command_read.py [--frames 64] [--repeats 20000] [--rounds 7]

No sockets: ``recv`` hands out prepared frames from a list and raises an exception of its own at
its end, so what is timed is the loop's Python (a real XPUB's recv adds ~1.5 µs a frame to both
alike). Three cases, each read of ``--frames`` frames: subscriptions only, commands within the
bound (a bucket refilled before each read, not timed), and a flood past it (drained to DRAIN_MAX,
then paused). Best of ``--rounds``, in ns per frame; ``calls`` for the helper (a function call a
read, the ``take`` callback a command). Figures, no assertions.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from probe.wire.command_bound import BURST, DRAIN_MAX, CommandBound, read_commands, subscription_change


class _Empty(Exception):
    pass


class _Frames:
    def __init__(self, frames: list[bytes]) -> None:
        self.frames, self.i = frames, 0

    def recv(self, flags: int) -> bytes:
        i = self.i
        if i >= len(self.frames):
            raise _Empty
        self.i = i + 1
        return self.frames[i]


class _OldLink:
    """The link's loop as it was inline (probe/transport/link.py before the helper)."""

    def __init__(self, sock: _Frames, gate: CommandBound) -> None:
        self._sock, self.gate, self.subscriptions = sock, gate, 0
        self._commands: list[bytes] = []
        self.overflow = 0

    def _read(self, now: float) -> None:
        gate, over, read = self.gate, False, 0
        limit = 64
        while read < limit:
            try:
                frame = self._sock.recv(1)
            except _Empty:
                break
            read += 1
            change = subscription_change(frame)
            if change:
                self.subscriptions = max(0, self.subscriptions + change)
            elif not gate.admit(now):
                if not over:
                    over, limit = True, DRAIN_MAX
            elif len(self._commands) < 16:
                self._commands.append(frame)
            else:
                self.overflow += 1
        if over:
            gate.pause(now)


class _NewLink(_OldLink):
    """The link's read through the helper (probe/transport/link.py now)."""

    def _read(self, now: float) -> None:
        self.subscriptions = read_commands(self.gate, self._sock.recv, 1, _Empty, 64, now,
                                           self.subscriptions, self._take)

    def _take(self, frame: bytes) -> None:
        if len(self._commands) < 16:
            self._commands.append(frame)
        else:
            self.overflow += 1


def _time(kind: type[_OldLink], frames: list[bytes], repeats: int, refill: bool) -> float:
    sock = _Frames(frames)
    link = kind(sock, CommandBound("bench"))
    spent = 0.0
    for _ in range(repeats):
        sock.i = 0
        link._commands = []
        if refill:
            link.gate = CommandBound("bench")
        link.subscriptions = 0
        t = time.perf_counter_ns()
        link._read(1.0)
        spent += time.perf_counter_ns() - t
    return spent / (repeats * len(frames))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    n = a.frames
    cases: dict[str, tuple[list[bytes], bool]] = {
        "subscriptions": ([b"\x01", b"\x00"] * (n // 2), False),
        "commands": ([b"\x92\xa4pace"] * min(n, BURST), True),
        "flood": ([b"\x02flood"] * n, False),  # a drained bucket: every frame dropped unread
    }
    out: dict[str, Any] = {}
    for name, (frames, refill) in cases.items():
        best: dict[str, float] = {}
        for _ in range(a.rounds):  # interleaved, best of each
            for label, kind in (("inline", _OldLink), ("helper", _NewLink)):
                best[label] = min(best.get(label, float("inf")), _time(kind, frames, a.repeats, refill))
        out[name] = {k: round(v, 1) for k, v in best.items()} | {"frames": len(frames)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
