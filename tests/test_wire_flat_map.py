"""The wire's flat-map check (telemetry's maps, probe/wire/checks.py) passes a map equal to the last
one that passed without testing its values again: whatever msgpack decodes that equals a valid map
must be valid, so a check that remembers says what a fresh one (no history) says, over maps one
value away from a valid one — values equal to the valid ones in another type included."""

from __future__ import annotations

import random
from typing import Any

import msgpack

from probe.wire.checks import _flat_map

NAN, INF = float("nan"), float("inf")
VALID: dict[str, Any] = {"power_w": 121.5, "clock": 1980, "util": 0.0, "on": True, "none": None, "name": "H200",
                         "throttle": ["sw_power_cap"], "empty": []}
# equal to a valid value in another type (1 == 1.0 == True, 0.0 == -0.0 == 0 == False), and not
VALUES: list[Any] = [1, 1.0, True, 0, 0.0, -0.0, False, None, NAN, INF, -INF, 1980.0, 121.5, "H200", "x" * 512,
                     "x" * 513, ["sw_power_cap"], ["sw_power_cap", 1], ["y" * 65], [], [[]], {}, b"H200", 2**64 - 1,
                     -(2**63), msgpack.ExtType(1, b"x")]


def _wire(value: Any) -> Any:
    """``value`` as a frame's decode gives it."""
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True))


def test_a_remembering_check_says_what_a_fresh_one_says() -> None:
    check = _flat_map()
    rng = random.Random(3)
    results = []
    for _ in range(3000):
        assert check(_wire(VALID))  # the map the next one is one value away from (or equal to)
        candidate = dict(VALID)
        for _ in range(rng.randrange(3)):
            candidate[rng.choice(list(VALID))] = rng.choice(VALUES)
        candidate = _wire(candidate)
        got = check(candidate)
        assert got == _flat_map()(candidate), candidate
        results.append(got)
    assert 0.2 < sum(results) / len(results) < 0.8  # both outcomes are exercised


def test_a_map_equal_to_a_valid_one_passes_and_a_refused_one_is_not_remembered() -> None:
    check = _flat_map()
    assert check(_wire(VALID))
    assert check(_wire({**VALID, "clock": 1980.0, "on": 1}))  # equal: passes (and is valid, as a fresh check says)
    assert _flat_map()(_wire({**VALID, "clock": 1980.0, "on": 1}))
    bad = _wire({**VALID, "util": NAN})
    assert not check(bad) and not check(bad)  # NaN equals nothing: tested each time, refused each time
    assert not check(_wire({**VALID, "name": "x" * 513}))
    assert check(_wire(VALID))


def test_what_the_check_keeps_stays_bounded_under_unique_names() -> None:
    """A flood of maps of names never seen: at most MAX_NAME_SETS name sets, and one map (the last
    that passed), however many pass."""
    from probe.wire.checks import MAX_NAME_SETS

    check = _flat_map()
    kept = dict(zip(check.__code__.co_freevars, (cell.cell_contents for cell in check.__closure__ or ())))
    for i in range(1000):
        hostile = _wire({f"name{i}": f"value{i}", f"other{i}": i})
        assert check(hostile)
        assert len(kept["passed"]) <= MAX_NAME_SETS
        assert kept["last"] == [hostile]
    assert not check(_wire({"name999": "x" * 513, "other999": 999}))  # the same names, a value too long
    assert kept["last"] == [_wire({"name999": "value999", "other999": 999})]
