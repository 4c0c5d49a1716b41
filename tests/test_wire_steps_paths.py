"""The step-column decode's two paths agree (probe/wire/steps.py): ``decode_fields`` takes a valid
frame's fields down one straight path and anything else down ``_decode_checked``, which tests field by
field. A check added to one and not the other would let a frame through one path that the other
refuses; here every mutation of a valid frame's fields gives the same columns or the same refusal
down both."""

from __future__ import annotations

import math
import random
import struct
from array import array
from typing import Any

import msgpack

from probe.wire import MAX_BATCH, WireError
from probe.wire.steps import _decode_checked, decode_fields

NAN, INF = float("nan"), float("inf")


def _d(*v: float) -> bytes:
    return array("d", v).tobytes()


def _q(*v: int) -> bytes:
    return array("q", v).tobytes()


BASE: dict[str, Any] = {"n": 3, "drops": 0, "step": _q(5, 6, 7), "tokens": _q(1, 2, 3), "wall_s": _d(.1, .2, .3),
                        "input_wait_s": _d(.01, .01, .01), "lead_s": _d(.05, .05, .05),
                        "probe_s": _d(1e-5, 1e-5, 1e-5), "stage_s": _d(.02, .02, .02), "device_s": 0.25}
COLUMNS = [None, b"", _q(1, 2), _q(1, 2, 3, 4), bytearray(_q(1, 2, 3)), "x" * 24, [1, 2, 3],
           msgpack.ExtType(1, _q(1, 2, 3)), _d(NAN, .1, .2), _d(.1, INF, .2), _d(-INF, 0, 0), _d(-0.0, 0.1, .2),
           _d(-1e-300, .1, .2), _d(1e7, 1e7, 1e7), _d(math.nextafter(1e7, 2e7), 0, 0), _d(NAN, NAN, NAN),
           struct.pack("<Q", 0x7ff8000000000001) + _d(0, 0), struct.pack("<Q", 0x8000000000000000) * 3,
           _q(-1, 0, 1), _q(5, 5, 6), _q(7, 6, 5), _q(2**63 - 1, 0, 0), _q(254, 255, 256), _q(0, 2**56, 2**57),
           # a negative step after a non-negative first (the straight path tests the first's sign only)
           _q(5, -1, 7), _q(0, 1, -2**63), _q(1, 2, -1)]
SCALARS = [None, True, False, 0, 1, -1, 3, 2**63 - 1, 2**63, 2**64 - 1, 0.0, -0.0, 1.5, NAN, INF, -INF, 1e7,
           10**7 + 1, "1", b"1", [1], {}, msgpack.ExtType(0, b""), 512, 513]
DELETE = object()


def _outcome(decode: Any, fields: dict[str, Any]) -> str:
    try:
        cols = decode(fields, MAX_BATCH)
    except WireError as exc:
        return f"refused: {exc}"
    return repr([c.tobytes() if isinstance(c, array) else c for c in cols])  # NaN-safe: columns as bytes


def _mutations() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for name in ("step", "tokens", "wall_s", "input_wait_s", "lead_s", "probe_s", "stage_s"):
        cases += [{name: v} for v in [*COLUMNS, DELETE]]
    for name in ("n", "drops", "device_s", "commands_refused", "commands_dropped"):
        cases += [{name: v} for v in [*SCALARS, DELETE]]
    rng = random.Random(7)
    names = [*BASE, "commands_refused", "commands_dropped"]
    for _ in range(2000):
        picks = [rng.choice(names) for _ in range(rng.randrange(1, 4))]
        cases.append({n: rng.choice([*(COLUMNS if isinstance(BASE.get(n), bytes) else SCALARS), DELETE]) for n in picks})
    return cases


def test_both_paths_give_the_same_columns_or_the_same_refusal() -> None:
    refused = accepted = 0
    for case in _mutations():
        fields = dict(BASE)
        for name, value in case.items():
            if value is DELETE:
                fields.pop(name, None)
            else:
                fields[name] = value
        straight, checked = _outcome(decode_fields, fields), _outcome(_decode_checked, fields)
        assert straight == checked, (case, straight, checked)
        refused += straight.startswith("refused")
        accepted += not straight.startswith("refused")
    assert refused > 1000 and accepted > 100  # both outcomes exercised, not one path's only


def test_a_valid_frame_at_the_batch_edges_decodes_alike() -> None:
    for n, first in ((1, 0), (1, 2**62), (45, 250), (2, 255), (MAX_BATCH, 7), (MAX_BATCH, 2**40 - 3)):
        fields = {"n": n, "drops": 0, "step": array("q", range(first, first + n)).tobytes(),
                  "tokens": _q(*[1] * n), "wall_s": _d(*[.1] * n)}
        assert _outcome(decode_fields, fields) == _outcome(_decode_checked, fields)
        assert not _outcome(decode_fields, fields).startswith("refused")
        if n > 1:  # a repeated step
            steps = array("q", range(first, first + n))
            steps[n // 2] = steps[n // 2 - 1]
            dup = {**fields, "step": steps.tobytes()}
            assert _outcome(decode_fields, dup) == _outcome(_decode_checked, dup)
            assert _outcome(decode_fields, dup).startswith("refused")


def test_hostile_step_columns_of_any_length_decode_alike() -> None:
    """Step columns written by hand against the straight path's sign test (the first step's sign,
    the others increasing from it): a negative step anywhere, int64's wrap from its largest value
    to its smallest, a run that looks consecutive by its ends (last - first == n - 1) with a
    negative or repeated step inside, a lone negative step, columns not a multiple of 8 bytes."""
    top, bottom = 2**63 - 1, -2**63
    inside = list(range(256))
    inside[100] = bottom + 100  # its low byte as a run of 0..255 would have it, its top bit set
    refused = [[-1], [bottom], [top, bottom], [top - 1, top, bottom], [0, -1, 2], [0, 0, 2], [3, 2**62, -1, 6],
               inside, [*range(200, 455)][:-1] + [bottom], [1, 2, 2, 3], [top, top]]
    accepted = [[0], [top], [top - 1, top], [*range(2**40 - 3, 2**40 + 197)], [0, 2**62, top]]
    for steps, ok in [*((s, False) for s in refused), *((s, True) for s in accepted)]:
        n = len(steps)
        fields = {"n": n, "drops": 0, "step": array("q", steps).tobytes(), "tokens": _q(*[1] * n),
                  "wall_s": _d(*[.1] * n)}
        straight = _outcome(decode_fields, fields)
        assert straight == _outcome(_decode_checked, fields), steps[:4]
        assert straight.startswith("refused") is not ok, (steps[:4], straight[:80])
    for raw in (b"", _q(1)[:7], _q(1, 2) + b"\0", _q(1, 2)[:-1]):  # n=1 or 2 against ragged bytes
        for n in (0, 1, 2):
            fields = {"n": n, "drops": 0, "step": raw, "tokens": _q(*[1] * n), "wall_s": _d(*[.1] * n)}
            straight = _outcome(decode_fields, fields)
            assert straight == _outcome(_decode_checked, fields) and straight.startswith("refused")
