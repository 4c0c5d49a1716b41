"""A telemetry frame's text is cleaned as any remote text is (flowtop.monitor.sanitize.clean), but
its maps equal to the rank's last ones are not walked again (sanitize.clean_maps): a printable
lookalike seen before must not let a string with control characters through, and the answer
must be clean()'s for any map of maps."""

from __future__ import annotations

import random
from typing import Any

import pytest

from flowtop.monitor import sanitize
from flowtop.monitor.sanitize import clean, clean_maps
from flowtop.monitor.wiring import make_model
from probe import wire

KEY = wire.RankKey("job", "node00", 1000, 0, 0)
REASON = "GPM needs two samples: values start with the next reading"


def _fields(name: str = "NVIDIA H200", reason: str = REASON, throttle: list[str] | None = None,
            power: float = 120.0) -> dict[str, Any]:
    return {"gpu": {"power_w": power, "sm_clock_mhz": 1980, "throttle": throttle or [], "tensor_active": None,
                    "name": name, "uuid": "GPU-6330a000"},
            "proc": {"proc_cpu_pct": 94.5, "threads": 22},
            "reasons": {"tensor_active": reason}}


def _ingest(frames: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    """Each frame through the wire and the model: (device map, reasons map) of the rank's view after it."""
    model = make_model()
    model.ingest(wire.decode(wire.encode("hello", KEY, 1, 1000.0, {"local_rank": 0, "world_size": 1, "device": "cuda",
                                                                    "probe_version": "1"})), 1000.0)
    out = []
    for i, fields in enumerate(frames):
        t = 1001.0 + i
        model.ingest(wire.decode(wire.encode("telemetry", KEY, 2 + i, t, fields)), t)
        tel = model.ranks[KEY].telemetry
        assert tel is not None
        out.append((dict(tel.device), dict(tel.reasons)))
    return out


def test_control_characters_after_a_printable_lookalike_are_escaped() -> None:
    views = _ingest([_fields(), _fields(name="NVIDIA H200\x1b[2J", power=121.0), _fields(power=122.0),
                     _fields(reason=REASON + "\u202e", power=123.0), _fields(throttle=["hw\x07slow"], power=124.0),
                     _fields(throttle=["sw_power_cap"], power=125.0), _fields(throttle=["sw_power_cap"], power=126.0)])
    names = [device["name"] for device, _ in views]
    assert names == ["NVIDIA H200", "NVIDIA H200\\x1b[2J", "NVIDIA H200", "NVIDIA H200", "NVIDIA H200",
                     "NVIDIA H200", "NVIDIA H200"]
    assert [reasons["tensor_active"] for _, reasons in views][2:4] == [REASON, REASON + "\\u202e"]
    assert [device["throttle"] for device, _ in views][3:] == [[], ["hw\\x07slow"], ["sw_power_cap"], ["sw_power_cap"]]
    assert [device["power_w"] for device, _ in views] == [120.0, 121.0, 122.0, 123.0, 124.0, 125.0, 126.0]


def test_a_map_equal_to_the_ranks_last_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    tested: list[str] = []
    real = sanitize._printable_texts

    def spy(texts: list[Any]) -> bool:
        tested.append("".join(texts))
        return real(texts)

    monkeypatch.setattr(sanitize, "_printable_texts", spy)
    _ingest([_fields(), _fields(power=121.0)])
    # the first frame: printable_deep's one text of every name and string; the second: the names of
    # the fields, then the device's names and strings (its power changed), not the unchanged host
    # and reasons
    assert REASON in tested[0] and "proc_cpu_pct" in tested[0]
    assert tested[1] == "gpuprocreasons" "power_wsm_clock_mhzthrottletensor_activenameuuid" "NVIDIA H200GPU-6330a000"


def _exact(x: Any) -> str:
    """A text of ``x`` that tells types apart (1 from 1.0 from True) and NaN from NaN."""
    if isinstance(x, float):
        return "float:nan" if x != x else f"float:{x!r}"
    if isinstance(x, dict):
        return "{" + ",".join(f"{_exact(k)}:{_exact(v)}" for k, v in x.items()) + "}"
    if isinstance(x, list):
        return "[" + ",".join(_exact(v) for v in x) + "]"
    return f"{type(x).__name__}:{x!r}"


TEXTS = ["NVIDIA H200", "NVIDIA H200\x1b", "NVIDIA\u202eH200", "Größe °C", "back\\slash", "\x7f", "", "é\u2028", "\t"]
VALUES: list[Any] = [None, True, 0, 1.0, float("nan"), *TEXTS, [], ["a"], ["a\x1b"], ["a", 1], [["b\x00"]],
                     {"k": "v"}, {"k\x1b": 1}, {1: "x"}, b"\x1b", ("t\x1b",)]


def _mutant(base: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    maps: dict[Any, Any] = {name: dict(inner) for name, inner in base.items()}
    for _ in range(rng.randrange(3)):
        c = rng.random()
        name = rng.choice(list(maps))
        if c < 0.1:
            inner = maps[name]
            maps[rng.choice(TEXTS + [7])] = rng.choice([dict(inner) if isinstance(inner, dict) else inner, *VALUES])
        elif c < 0.2:
            maps[name] = rng.choice(VALUES)
        elif isinstance(maps[name], dict):
            key = rng.choice(list(maps[name]) + TEXTS) if c < 0.9 else rng.choice([1, b"k", None])
            maps[name][key] = rng.choice(VALUES)
    return maps


def test_clean_maps_equals_clean_over_mutations() -> None:
    """clean_maps(maps, last) gives clean(maps), the very object where clean() gives it back, with
    ``last`` the cleaned maps of earlier mutants (as a rank's view holds them)."""
    rng = random.Random(5)
    last: tuple[Any, ...] = ()
    differs = 0
    for _ in range(3000):
        maps = _mutant(_fields(), rng)
        want, got = clean(maps), clean_maps(maps, last)
        assert _exact(got) == _exact(want)
        assert (got is maps) == (want is maps)
        differs += want is not maps
        if all(isinstance(v, dict) for v in want.values()):
            last = tuple(v for v in want.values())
    assert 300 < differs < 2700  # both outcomes are exercised


def test_series_sample_the_device_numbers_and_nothing_else() -> None:
    """push_telemetry samples what push_series did: ints and floats (an int subclass too), not a
    bool, a string or None, in the series' first-seen order, the MFU last (None: no sample)."""
    import enum

    from flowtop.monitor.rankstate import RankState

    class Clock(enum.IntEnum):
        MAX = 1980

    st = RankState(key=KEY, first_seen=0.0, last_recv=0.0)
    st.push_telemetry({"tensor_active": None, "power_w": 120.5, "sm_clock_mhz": 1980}, None)
    st.push_telemetry({"tensor_active": True, "power_w": "121", "sm_clock_mhz": Clock.MAX}, 0.25)
    st.push_telemetry({"tensor_active": 41, "power_w": 122.0}, None)
    assert {name: list(column) for name, column in st.series.items()} == {
        "power_w": [120.5, 122.0], "sm_clock_mhz": [1980.0, 1980.0], "mfu": [0.25], "tensor_active": [41.0]}
    assert list(st.series) == ["power_w", "sm_clock_mhz", "mfu", "tensor_active"]
