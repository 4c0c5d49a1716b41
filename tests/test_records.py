"""flowtop.monitor.records.fast_init: the same records as the dataclass constructor made, faster."""

from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass, field

import pytest

from flowtop.monitor.records import fast_init
from flowtop.monitor.snapshot import FlopsView, Hint, History, RankSnapshot, TelemetryView


@fast_init
@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: float = 2.5
    tags: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Plain:  # the dataclass's own constructor, to compare with
    x: int
    y: float = 2.5
    tags: dict = field(default_factory=dict)


def test_fast_init_takes_the_same_arguments_and_builds_the_same_record() -> None:
    for args, kwargs in [((1,), {}), ((1, 3.0), {}), ((1,), {"tags": {"a": 1}}), ((), {"y": 1.0, "x": 4})]:
        p, q = Point(*args, **kwargs), Plain(*args, **kwargs)
        assert (p.x, p.y, p.tags) == (q.x, q.y, q.tags)
    assert Point(1).tags is not Point(1).tags  # a fresh default each time, as default_factory says
    assert Point(1, 2.5, {}) == Point(1) != Point(2)
    assert dataclasses.replace(Point(1), y=7.0) == Point(1, 7.0)
    with pytest.raises(TypeError):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Point(1, z=3)  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Point(1).x = 2  # type: ignore[misc]


def test_fields_are_stored_on_a_twin_class_and_the_record_is_its_own_class_again() -> None:
    """The constructor makes its object a twin of the same layout to store the fields as plain
    slot writes (flowtop.monitor.records._twin): the record comes out of its own class, frozen."""
    from flowtop.monitor.records import _twin

    assert "_set_class" in Point.__init__.__code__.co_names  # the twin path, not a descriptor call a field
    p = Point(3, 4.0)
    assert type(p) is Point and p == Point(3, 4.0) and (p.x, p.y, p.tags) == (3, 4.0, {})
    twin = _twin(Point)
    assert twin is not None and twin.__slots__ == Point.__slots__ and not isinstance(p, twin)


def test_the_snapshot_records_keep_every_field_and_stay_frozen() -> None:
    history = History(steps=(1, 2), step_time_s=(0.1, 0.2))
    assert history.steps == (1, 2) and history.reached == () and history.mfu == ()
    tel = TelemetryView({"power_w": 500.0}, {}, {}, 3.0)
    assert tel.age_s(5.0) == 2.0
    values = {f.name: f"v{i}" for i, f in enumerate(dataclasses.fields(RankSnapshot))}
    r = RankSnapshot(**values)
    assert all(getattr(r, name) == value for name, value in values.items())
    assert RankSnapshot(*values.values()) == r
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.step = 3  # type: ignore[misc]
    hint = Hint("input_wait", "warning", "rank", "rank 0", "s", {}, "a", 0.5)
    assert (hint.ended, hint.first_step, hint.last_step) == (False, None, None)
    flops = FlopsView(*[None] * 9, "src", "bf16", "causal", None)
    assert flops.uncounted_ops == {} and flops.peak_source == "src"


@dataclass(frozen=True, slots=True)
class Checked:
    x: int

    def __post_init__(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class WithInitVar:
    x: int
    scale: InitVar[int] = 1


@pytest.mark.parametrize(("cls", "why"), [(Checked, "__post_init__"), (WithInitVar, "more than its fields")])
def test_fast_init_refuses_what_it_cannot_copy(cls: type, why: str) -> None:
    with pytest.raises(TypeError, match=why):
        fast_init(cls)


def test_a_subclass_of_a_fast_init_record_is_built_as_itself() -> None:
    """Only an object of the decorated class wears its twin while its fields are stored: a subclass
    (with or without slots of its own) comes out of its own class, frozen, with its methods."""

    class Loud(Hint):
        __slots__ = ()

        def loud(self) -> str:
            return self.summary.upper()

    class WithDict(Hint):
        pass

    args = ("x", "info", "job", "", "s", {}, "a", 0.1)
    loud = Loud(*args)
    assert type(loud) is Loud and loud.loud() == "S" and dataclasses.astuple(loud) == dataclasses.astuple(Hint(*args))
    with_dict = WithDict(*args)
    assert type(with_dict) is WithDict and with_dict.summary == "s"
    with pytest.raises(dataclasses.FrozenInstanceError):
        loud.summary = "t"  # type: ignore[misc]


def test_a_record_whose_twin_cannot_be_made_keeps_the_descriptor_path() -> None:
    """A generic base refuses a plain subclass (the twin): the record is built slot by slot."""
    from typing import Generic, TypeVar

    V = TypeVar("V")

    @fast_init
    @dataclass(frozen=True, slots=True)
    class Boxed(Generic[V]):
        value: V
        tags: list[str] = field(default_factory=list)

    box = Boxed(3)
    assert type(box) is Boxed and box.value == 3 and box.tags == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        box.value = 4  # type: ignore[misc]
