"""A faster constructor for the frozen, slotted records of a snapshot. No Textual.

A frozen dataclass stores each field with ``object.__setattr__(self, name, value)``: a name
looked up on the type, then its slot's descriptor called, field by field. A 4,096-rank monitor
makes ~4,000 rank views a tick (31 fields each, most of them light copies with a new step), and
that constructor was the larger part of a copy. :func:`fast_init` gives such a class an
``__init__`` with the same signature (defaults and default factories included) that stores each
field as a plain slot write, the object a twin class of the same layout meanwhile (see ``_twin``;
where that cannot be, a call of each slot's descriptor): the same object, in about a quarter of
the time. Assigning to a field afterwards still raises ``FrozenInstanceError``; the class is
otherwise untouched.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields
from operator import attrgetter
from typing import Any, TypeVar

T = TypeVar("T")

_NO_VALUE = object()  # a parameter whose field has a default factory was not passed


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen slotted dataclass ``cls`` an ``__init__`` that stores through its slots."""
    params, body = [], []
    ns: dict[str, Any] = {"_NO_VALUE": _NO_VALUE, "__name__": cls.__module__}
    own = fields(cls)  # type: ignore[arg-type]
    if len(inspect.signature(cls.__init__).parameters) != len(own) + 1:  # an InitVar: not a field
        raise TypeError(f"fast_init: {cls.__name__}'s constructor takes more than its fields")
    twin = _twin(cls)
    factories, stores, sets = [], [], []
    for i, f in enumerate(own):
        if not f.init or f.kw_only is True:
            raise TypeError(f"fast_init: {cls.__name__}.{f.name} is not a plain positional field")
        ns[f"_set{i}"] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        if f.default is not MISSING:
            ns[f"_default{i}"] = f.default
            params.append(f"{f.name}=_default{i}")
        elif f.default_factory is not MISSING:
            ns[f"_factory{i}"] = f.default_factory
            params.append(f"{f.name}=_NO_VALUE")
            factories.append(f"    if {f.name} is _NO_VALUE:\n        {f.name} = _factory{i}()")
        else:
            params.append(f.name)
        stores.append(f"        self.{f.name} = {f.name}")
        sets.append(f"    _set{i}(self, {f.name})")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"fast_init: {cls.__name__} has a __post_init__")
    body = factories + sets  # the factories first: nothing but stores runs while the object is the twin
    if twin is not None and stores:
        # Only an object of the class itself wears the twin: a subclass's layout may differ (and
        # would come out as this class).
        ns.update(_set_class=object.__setattr__, _twin=twin, _cls=cls)
        body = [*factories, "    if self.__class__ is _cls:", "        _set_class(self, '__class__', _twin)", *stores,
                "        _set_class(self, '__class__', _cls)", "    else:", *("    " + line for line in sets)]
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(source, ns)  # noqa: S102 (generated from the class's own field names, as dataclasses does)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


def _twin(cls: type) -> type | None:
    """A class of the same bases and slots as ``cls`` without its frozen ``__setattr__``, or None
    where an object of ``cls`` cannot be made one for a while (its ``__class__`` not assignable).

    The constructor makes its object this twin, stores each field as a plain attribute and makes
    it ``cls`` again: two calls, then a store a field that the interpreter specializes to a slot
    write. Each call of a slot's descriptor (``_set{i}(self, value)``) parsed a tuple of arguments
    (~350 instructions a field: a 31-field rank view ~9 µs; the same ~4 µs this way), and a
    4,096-rank round makes ~45,000 views (RankViews' copies, Model._as_now's)."""
    try:  # a base may refuse a subclass (Generic), and its __init_subclass__ sees this one
        twin = type(f"_{cls.__name__}Fields", cls.__bases__, {"__slots__": cls.__dict__.get("__slots__", ())})
    except Exception:
        return None
    if twin.__setattr__ is not object.__setattr__:  # a base's own __setattr__ (frozen) would refuse the stores
        return None
    try:
        probe: object = object.__new__(cls)
        object.__setattr__(probe, "__class__", twin)
        object.__setattr__(probe, "__class__", cls)
    except TypeError:
        return None
    return twin


class Fields:
    """The fields of a dataclass in order, for positional copies of its records:
    ``values = list(F.read(obj))`` reads them in one C call, ``values[i] = ...`` changes those at
    :meth:`at`, ``cls(*values)`` builds the copy (dataclasses.replace builds keyword arguments;
    a 4,096-rank tick makes thousands of such copies of rank views)."""

    def __init__(self, cls: type) -> None:
        self.names = [f.name for f in fields(cls)]
        #: obj -> the tuple of its fields' values, in order.
        self.read = attrgetter(*self.names)

    def at(self, *names: str) -> tuple[int, ...]:
        """The positions of ``names`` among the fields."""
        return tuple(self.names.index(n) for n in names)


class Slotted:
    """Base of the records every rank's view holds: their fields in slots, not a dict each (a
    4,096-rank monitor keeps two ticks of views), still weakly referenceable (the hint measures'
    memo holds them weakly; dataclass's own weakref_slot needs Python 3.11)."""

    __slots__ = ("__weakref__",)
