"""What the model holds at the end of ``bench/ingest.py --memory``, by object type and by holder:
bytes a rank (``sys.getsizeof`` of every object reachable from the model, modules and classes
left out), without tracemalloc, so a few minutes at 4,096 ranks where bench/mem_where.py (traced,
12 frames) takes far longer on a loaded box.

    python bench/mem_types.py 512 [TOP]       # from a checkout's root: ranks, types printed (20)

Prints the reachable KB a rank by type (count a rank, mean size), then by field of the ranks'
``RankState`` (each field's objects and what they reach), then by attribute of the model beyond
what its ``RankState`` objects reach (views, hints, merges; each attribute counts all it reaches,
so two that share objects both count them: the hint engine's bound callbacks reach the views).
2026-12-07, 512 ranks at 2ba16cb:
32.7 KB a rank reachable, arrays 22.6 of it (the step ring 14.0, sparkline series 7.8, probe
times 1.2, kernel table 3.1), the hint engine's per-rank hints ~2.2, the views 2.0.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
from dataclasses import fields
from typing import Any, Iterable

sys.path.insert(0, os.getcwd())  # the checkout under test: the working directory's
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))
import ingest  # noqa: E402 - bench/


def _reach(roots: Iterable[Any], stop: Iterable[Any] = ()) -> list[Any]:
    """Every object reachable from ``roots`` (gc.get_referents), none of ``stop``'s, no types,
    modules or functions (shared code, not the model's data)."""
    seen = set(map(id, stop))
    stack, out = list(roots), []
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, type) or type(o).__name__ in ("module", "function"):
            continue
        seen.add(id(o))
        out.append(o)
        stack.extend(gc.get_referents(o))
    return out


def _kb(objs: Iterable[Any], ranks: int) -> float:
    return sum(sys.getsizeof(o) for o in objs) / ranks / 1024


def main() -> None:
    ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    from flowtop.monitor import wiring

    made: list[Any] = []
    make = wiring.make_model

    def keep(*a: Any, **k: Any) -> Any:
        made.append(make(*a, **k))
        return made[-1]

    wiring.make_model = keep  # type: ignore[assignment]  # ingest imports it inside memory()
    r = ingest.memory(ranks, traced=False)
    print(r["kb_per_rank"], r["parts_kb_per_rank"])
    model = made[0]
    gc.collect()
    objs = _reach([model])
    size: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for o in objs:
        size[type(o).__name__] += sys.getsizeof(o)
        count[type(o).__name__] += 1
    print(f"reachable from the model: {_kb(objs, ranks):.2f} KB a rank")
    for t, b in size.most_common(top):
        print(f"{b / ranks / 1024:7.2f} KB/rank {count[t] / ranks:8.1f}/rank {b / count[t]:7.0f} B  {t}")
    states = list(model.ranks.values())
    for f in fields(states[0]):
        kb = _kb(_reach([getattr(st, f.name) for st in states], stop=[None]), ranks)
        if kb >= 0.05:
            print(f"RankState.{f.name}: {kb:.2f} KB/rank")
    held = _reach(states)
    for name, value in vars(model).items():
        kb = _kb(_reach([value], stop=held), ranks)
        if kb >= 0.05 and name != "ranks":
            print(f"Model.{name}: {kb:.2f} KB/rank beyond the RankStates")


if __name__ == "__main__":
    main()
