"""A kernel window's records are checked column by column (probe.wire.kernels' bulk checks) and,
only when that says "look closer", record by record. The bulk checks must never pass what the
record checks refuse: here they meet every tricky value at every field of real H200 records."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

import pytest

from flowtop.monitor.recording import read_recording
from probe import wire
from probe.wire import kernels as K
from probe.wire.errors import WireError

REC = Path(__file__).parent / "data" / "h200-gpt-small.rec.gz"

#: Values that sit at or past an edge of some field's rule.
TRICKY: list[Any] = [
    None, True, False, 0, 1, -1, 4, 3, 5, 2**31, 2**31 + 1, 2**62, 2**62 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1,
    0.0, -0.0, 1.5, -1.5, 1e12, 1e12 + 1, -1e12, -1e12 - 1, 1e300, math.inf, -math.inf, math.nan,
    "", "x", "x" * 64, "x" * 65, [], [1], [True, 2], [1.0], [None], [[1]], [[[1]]], [1] * 16, [1] * 17,
    [[1] * 8], [[1] * 9], [[1, 2]] * 16, [[1, 2]] * 17, [[2, -3]], [[2, 2**63]], [[2, 1.0]], [[True]],
    ["x" * 65], [math.nan], [math.inf], [[2**63]], {"a": 1}, (1, 2), b"x",
]


@pytest.fixture(scope="module")
def window() -> dict[str, Any]:
    for _, frame in read_recording(REC):
        msg = wire.decode(frame)
        if msg.kind == "kernels":
            return dict(msg.fields)
    raise AssertionError("no kernels frame in the recording")


def _by_record(field: str, records: list[Any]) -> bool:
    check = K._ops_by_record if field == "ops" else K._acts_by_record
    try:
        return check(records)
    except WireError:
        return False


def test_a_real_window_passes_in_bulk(window: dict[str, Any]) -> None:
    """The fast path is the one real windows take (else it would only cost time)."""
    assert len(window["ops"]) > 1000 and len(window["acts"]) > 300
    assert K._ops_in_bulk(window["ops"]) and K._acts_in_bulk(window["acts"])


@pytest.mark.parametrize("field", ["ops", "acts"])
def test_the_bulk_checks_never_pass_a_record_the_record_checks_refuse(window: dict[str, Any], field: str) -> None:
    rng = random.Random(7)
    base = window[field][:300]
    refused = agreed = 0
    for trial in range(3000):
        records = copy.deepcopy(base) if trial % 50 == 0 else [list(r) for r in base]
        for _ in range(rng.choice((1, 1, 1, 2))):
            r = rng.randrange(len(records))
            if rng.random() < 0.05:  # the record itself: too short, too long, not a list
                records[r] = rng.choice([records[r][:6], records[r] + [0], tuple(records[r]), None, 7])
                continue
            records[r] = list(records[r])
            i = rng.randrange(7)
            value = rng.choice(TRICKY)
            if i in (5, 6) and field == "ops" and isinstance(records[r][i], list) and records[r][i] and rng.random() < 0.5:
                inner = list(records[r][i])  # one input of dims/concrete, not the whole field
                inner[rng.randrange(len(inner))] = value
                value = inner
            records[r][i] = value
        bulk = (K._ops_in_bulk if field == "ops" else K._acts_in_bulk)(records)
        ok = _by_record(field, records)
        assert not bulk or ok, f"bulk passed what the record checks refuse: trial {trial}"
        refused += not ok
        agreed += bulk == ok
    print(f"{field}: {refused} of 3000 mutated windows refused; bulk and record checks agreed on {agreed}")
    assert 1000 < refused < 2900  # the mutations reach both verdicts
    assert agreed > 2500  # and the bulk checks only rarely send a good window to the slow path


def test_a_bad_record_is_still_named(window: dict[str, Any]) -> None:
    ops = [list(o) for o in window["ops"]]
    ops[1234][2] = math.nan
    with pytest.raises(WireError, match="'ops': record 1234: start/end"):
        K._kernel_ops(ops)
