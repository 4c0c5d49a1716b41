"""The package layout as a static contract (issue 12): no import cycles, nothing imports upward.

Every import counts, wherever it is written (module level, inside a function, under
TYPE_CHECKING): an import cycle hidden in a function is still a cycle to whoever reads the code.
Layers, lowest first (a module may import its own group and lower layers only; groups on one
layer are independent of each other):

    flowtop: settings (0) < monitor (1) < export, tui (2) < tools (3) < cli (4) < __main__ (5)
    probe:   wire (0) < _log, hookutil, config, identity (1) < flops, kernels, telemetry, transport (2)
             < steps (3) < runtime, sampled (4) < probe (the public API, 5) < bootstrap (6)

Boundaries: flowtop imports from the probe only ``probe.wire`` (the doctor's child, which runs in
the training interpreter, imports the probe itself); the probe never imports flowtop; the data side
(monitor, export) never imports Textual, rich or torch; the UI opens no socket and reads the hints
only through ``flowtop.monitor.hints``' public API.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (module prefix, layer, group): the longest matching prefix places a module.
LAYERS = [
    ("flowtop", 0, "flowtop"),
    ("flowtop.settings", 0, "settings"),
    ("flowtop.monitor", 1, "monitor"),
    ("flowtop.export", 2, "export"),
    ("flowtop.tui", 2, "tui"),
    ("flowtop.tools", 3, "tools"),
    ("flowtop.cli", 4, "cli"),
    ("flowtop.__main__", 5, "main"),  # python -m flowtop
    ("probe.wire", 0, "wire"),
    ("probe._log", 1, "base"),
    ("probe.hookutil", 1, "base"),
    ("probe.config", 1, "base"),
    ("probe.identity", 1, "base"),
    ("probe.ending", 1, "base"),
    ("probe.flops", 2, "flops"),
    ("probe.kernels", 2, "kernels"),
    ("probe.telemetry", 2, "telemetry"),
    ("probe.transport", 2, "transport"),
    ("probe.steps", 3, "steps"),
    ("probe.runtime", 4, "runtime"),
    ("probe.sampled", 4, "runtime"),
    ("probe", 5, "probe"),
    ("probe.bootstrap", 6, "bootstrap"),
]
#: Top-level modules allowed directly in flowtop/ (everything else lives in a layer's package).
FLOWTOP_TOP = {"flowtop", "flowtop.cli", "flowtop.settings", "flowtop.__main__"}
#: The probe modules flowtop may import, and the one flowtop module that runs inside training.
PROBE_FOR_FLOWTOP = ("probe.wire",)
RUNS_IN_TRAINING = {"flowtop.tools.doctor_child"}
DATA_SIDE_BANNED = ("textual", "rich", "torch")
UI_BANNED = ("zmq", "socket", "http", "urllib", "flowtop.monitor.collector", "flowtop.monitor.collector_net", "flowtop.monitor.relays")


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for top in ("flowtop", "probe"):
        for p in sorted((ROOT / top).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            is_pkg = parts[-1] == "__init__"
            mods[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return mods


MODULES = _modules()


def _imports(name: str) -> list[tuple[str, int]]:
    """(imported name, line) for every import of ``name``, relative ones resolved; a
    ``from pkg import sub`` names the submodule when there is one."""
    path, is_pkg = MODULES[name]
    pkg = name if is_pkg else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                full = f"{mod}.{a.name}"
                out.append((full if full in MODULES else mod, node.lineno))
    return out


def _resolve(imported: str) -> str | None:
    """The module of ours an imported name lands in (None: not ours)."""
    parts = imported.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in MODULES:
            return ".".join(parts[:k])
    return None


def _place(name: str) -> tuple[int, str]:
    best = max((p for p in LAYERS if name == p[0] or name.startswith(p[0] + ".")), key=lambda p: len(p[0]))
    return best[1], best[2]


GRAPH = {m: sorted({(t, line) for i, line in _imports(m) if (t := _resolve(i)) and t != m}) for m in MODULES}


def test_every_module_has_a_place() -> None:
    loose = [m for m in MODULES if m.startswith("flowtop") and m.count(".") == 1 and m not in FLOWTOP_TOP
             and not MODULES[m][1]]
    assert not loose, f"modules directly in flowtop/ belong in a layer's package: {loose}"
    loose = [m for m in MODULES if m.startswith("probe.") and m.count(".") == 1 and not MODULES[m][1]
             and _place(m)[1] == "probe"]
    assert not loose, f"modules directly in probe/ belong in a group (or LAYERS): {loose}"


def test_no_import_cycles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(GRAPH):
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("side", ["flowtop", "probe"])
def test_nothing_imports_upward(side: str) -> None:
    bad = []
    for m, edges in GRAPH.items():
        if m.split(".")[0] != side:
            continue
        layer, group = _place(m)
        for t, line in edges:
            if t.split(".")[0] != side:
                continue
            t_layer, t_group = _place(t)
            if t_group != group and t_layer >= layer:
                bad.append(f"{m}:{line} -> {t} ({group} {layer} -> {t_group} {t_layer})")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_probe_and_flowtop_boundary() -> None:
    bad = []
    for m, edges in GRAPH.items():
        for t, line in edges:
            if m.startswith("probe") and t.startswith("flowtop"):
                bad.append(f"{m}:{line} -> {t}")
            if (m.startswith("flowtop") and t.startswith("probe") and m not in RUNS_IN_TRAINING
                    and not any(t == p or t.startswith(p + ".") for p in PROBE_FOR_FLOWTOP)):
                bad.append(f"{m}:{line} -> {t}")
    assert not bad, "\n".join(bad)


def test_probe_wire_imports_nothing_else_from_probe() -> None:
    bad = [f"{m} -> {t}" for m, edges in GRAPH.items() if m.startswith("probe.wire")
           for t, _ in edges if not t.startswith("probe.wire")]
    assert not bad


def _third_party(m: str) -> list[tuple[str, int]]:
    return [(i, line) for i, line in _imports(m)]


def test_data_side_imports_neither_textual_nor_torch() -> None:
    bad = [f"{m}:{line} imports {i}" for m in MODULES if m.startswith(("flowtop.monitor", "flowtop.export"))
           for i, line in _third_party(m) if i.split(".")[0] in DATA_SIDE_BANNED]
    assert not bad, "\n".join(bad)


def test_ui_opens_no_socket_and_reads_hints_through_their_api() -> None:
    bad = []
    for m in MODULES:
        if not m.startswith("flowtop.tui"):
            continue
        for i, line in _third_party(m):
            if any(i == b or i.startswith(b + ".") for b in UI_BANNED):
                bad.append(f"{m}:{line} imports {i}")
            if i.startswith("flowtop.monitor.hints."):
                bad.append(f"{m}:{line} imports {i} (use flowtop.monitor.hints)")
    assert not bad, "\n".join(bad)
