"""Import boundaries: probe ⟂ flowtop, the monitor's data side ⟂ Textual, the UI ⟂ sockets.

Two checks of the same contracts:

* static: every module of ``probe/`` and ``flowtop/`` is parsed and each ``import`` (at module
  level or inside a function) is resolved to a module name, so a lazy import breaks a contract
  as surely as a top-level one;
* at runtime: every data-side module is imported in a fresh interpreter (a fork of one, per
  module) and ``sys.modules`` is read afterwards (what an import really drags in, third-party packages included).

The modules are found by walking the packages, so a new module is checked without being listed.
How they are classified (read from the code):

* UI: ``flowtop/tui/app.py``, ``flowtop/tui/screens/``, ``flowtop/tui/widgets/`` (Textual widgets and
  screens; they render snapshots and never own a socket);
* UI entry points: ``flowtop/cli.py`` and ``flowtop/tools/demo/launch.py`` start the app, importing it
  inside the function that does (``import flowtop.cli`` loads no Textual);
* guest side inside the flowtop package: ``flowtop/tools/doctor_child.py`` (a script run in a training
  interpreter to see what it sees: it imports ``probe`` and torch, never ``flowtop``) and
  ``flowtop/tools/demo/gpt.py``, ``flowtop/tools/demo/train.py`` (the demo's training processes, torch);
* data side: every other module of ``flowtop/``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

UI_PACKAGES = ("flowtop.tui.screens", "flowtop.tui.widgets")
UI_MODULES = {"flowtop.tui.app"}
ENTRY_POINTS = {"flowtop.cli", "flowtop.tools.demo.launch"}
GUEST_IN_FLOWTOP = {"flowtop.tools.doctor_child", "flowtop.tools.demo.gpt", "flowtop.tools.demo.train"}
#: What the monitor may import from probe: the wire schema and the probe's logger.
MONITOR_FROM_PROBE = ("probe.wire", "probe._log")
#: Data-side imports of a UI module that are known and allowed, with why.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}  # none since issue 12's layout


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    """Every module of probe/ and flowtop/, by dotted name."""
    found = {}
    for pkg in ("probe", "flowtop"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[_module_name(path)] = path
    return found


def _exists(name: str) -> bool:
    return name in modules()


@lru_cache(maxsize=None)
def imports(module: str) -> tuple[tuple[str, bool], ...]:
    """(imported module, at module level) for every import statement of ``module``.

    ``from a import b`` names ``a.b`` when that is a module of ours, else ``a``; relative
    imports are resolved against the module's package.
    """
    path = modules()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    # Imports under `if TYPE_CHECKING:` never run: they bind no boundary.
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    # Module-level statements nested in try/if blocks run at import time too.
    for node in tree.body:
        if isinstance(node, (ast.Try, ast.If)):
            for stmt in ast.walk(node):
                if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    top_level.add(id(stmt))
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        eager = id(node) in top_level
        if isinstance(node, ast.Import):
            found.extend((alias.name, eager) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.append((sub if _exists(sub) else source, eager))
    return tuple(found)


def is_ui(module: str) -> bool:
    return module in UI_MODULES or any(module == p or module.startswith(p + ".") for p in UI_PACKAGES)


def data_side() -> list[str]:
    return [m for m in modules() if m.startswith("flowtop") and not is_ui(m)
            and m not in ENTRY_POINTS and m not in GUEST_IN_FLOWTOP]  # fmt: skip


def _top(name: str) -> str:
    return name.split(".")[0]


def _loaded_at_import(module: str) -> set[str]:
    """Every module (ours and third-party top-level names) that ``import module`` executes,
    following module-level imports through our own modules."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        # importing a.b.c runs a and a.b first
        parts = m.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)) if _exists(".".join(parts[:i])))
        if _exists(m):
            todo.extend(name for name, eager in imports(m) if eager)
    return seen


# ----------------------------------------------------------------------------- static checks
def test_the_walk_finds_and_classifies_every_module() -> None:
    """The classification covers what the code holds (a renamed UI module would otherwise be
    checked as data side, or a removed one silently dropped)."""
    mods = modules()
    assert len([m for m in mods if m.startswith("probe")]) > 20 and len(data_side()) > 50
    for named in (*UI_MODULES, *ENTRY_POINTS, *GUEST_IN_FLOWTOP, *UI_PACKAGES, *MONITOR_FROM_PROBE):
        assert named in mods, f"{named} is named in this test but is not a module any more"
    assert "flowtop.monitor.collector" in data_side() and "flowtop.monitor.model" in data_side()
    # Every module that imports textual is a UI module (checked below the other way round too).
    textual_users = {m for m in mods if any(_top(n) == "textual" for n, _ in imports(m))}
    assert textual_users and all(is_ui(m) for m in textual_users), sorted(textual_users)


def test_probe_never_imports_flowtop_or_textual() -> None:
    bad = [(m, n) for m in modules() if _top(m) == "probe"
           for n, _ in imports(m) if _top(n) in ("flowtop", "textual")]  # fmt: skip
    assert not bad, bad


def test_guest_modules_in_flowtop_never_import_flowtop_ui_or_textual() -> None:
    bad = [(m, n) for m in GUEST_IN_FLOWTOP for n, _ in imports(m)
           if _top(n) == "textual" or is_ui(n) or n in ENTRY_POINTS]  # fmt: skip
    assert not bad, bad
    # doctor_child stands for a training process: it must not import flowtop at all.
    assert not [n for n, _ in imports("flowtop.tools.doctor_child") if _top(n) == "flowtop"]


def test_data_side_never_imports_textual_nor_the_ui() -> None:
    bad = []
    for m in data_side():
        for n, _ in imports(m):
            if _top(n) == "textual":
                bad.append((m, n, "imports textual"))
            elif is_ui(n) and (m, n) not in UPWARD_ALLOWED:
                bad.append((m, n, "imports a UI module"))  # entry points it may call (lazily, above)
    assert not bad, bad


def test_importing_a_data_side_module_or_entry_point_loads_no_textual() -> None:
    """Transitively, over module-level imports: what ``import m`` executes (entry points too:
    they import the app only inside the function that starts it)."""
    bad = {}
    for m in (*data_side(), *sorted(ENTRY_POINTS)):
        loaded = _loaded_at_import(m)
        hits = sorted(n for n in loaded if _top(n) == "textual" or is_ui(n))
        # an allowed upward import, and the parent packages it runs
        allowed = {t for (x, t) in UPWARD_ALLOWED if x in loaded}
        hits = [n for n in hits if not any(n == t or t.startswith(n + ".") for t in allowed)]
        if hits:
            bad[m] = hits
    assert not bad, bad


def test_monitor_imports_only_the_wire_schema_and_log_from_probe() -> None:
    def allowed(name: str) -> bool:
        return any(name == a or name.startswith(a + ".") for a in MONITOR_FROM_PROBE)

    bad = [(m, n) for m in modules() if _top(m) == "flowtop" and m not in GUEST_IN_FLOWTOP
           for n, _ in imports(m) if _top(n) == "probe" and not allowed(n)]  # fmt: skip
    assert not bad, bad


def test_ui_never_imports_zmq() -> None:
    bad = [(m, n) for m in modules() if is_ui(m) for n, _ in imports(m) if _top(n) == "zmq"]
    assert not bad, bad


def test_the_static_resolver_sees_lazy_relative_and_from_imports() -> None:
    """The checks above can fail: the resolver finds what they look for in known places."""
    cli = dict(imports("flowtop.cli"))
    assert cli.get("flowtop.tui.app") is False  # `from flowtop.tui.app import FlowtopApp` inside a function
    cli_args = dict(imports("flowtop.tools.cli_args"))  # flowtop.cli's parser
    assert cli_args.get("probe.wire") is True  # `from probe import wire`: the submodule, at module level
    assert ("flowtop.monitor.telemetry", True) in imports("flowtop.export.exporter_metrics")
    assert any(_top(n) == "zmq" for n, _ in imports("flowtop.monitor.collector"))
    assert any(n == "probe" for n, _ in imports("flowtop.tools.doctor_child"))


# ---------------------------------------------------------------------------- runtime checks
def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


#: One interpreter that forks a child per module name (argv): each child imports its module into
#: the fresh interpreter's sys.modules and writes them back as JSON. The same check as one
#: ``python -c "import MODULE"`` per module, without ~115 interpreter start-ups (~0.1 s of CPU each).
_FORKER = r"""
import json, os, sys
for name in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            __import__(name)
            out = {"modules": sorted(sys.modules)}
        except BaseException as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(out).encode()
        while data:
            data = data[os.write(w, data):]
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    got = json.loads(b"".join(chunks) or b'{"error": "the child wrote nothing"}')
    if status:
        got = {"error": f"the child ended with status {status}: {got}"}
    print(json.dumps({"name": name, **got}), flush=True)
"""


@lru_cache(maxsize=None)
def _imported_by_each(names: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """``{module: {"modules": sys.modules after importing it alone} or {"error": why}}``."""
    out = subprocess.run([sys.executable, "-c", _FORKER, *names], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    return {got.pop("name"): got for got in map(json.loads, out.stdout.splitlines())}


def _modules_after_import(module: str) -> set[str]:
    """sys.modules of a fresh interpreter after ``import module``, one of RUNTIME_CHECKED (see _FORKER)."""
    got = _imported_by_each(tuple(RUNTIME_CHECKED))[module]
    assert "error" not in got, got["error"]
    return set(got["modules"])  # type: ignore[arg-type]


def _tops(mods: set[str]) -> set[str]:
    return {_top(m) for m in mods}


def test_probe_imports_neither_textual_nor_flowtop() -> None:
    mods = _tops(_modules_after("import probe, probe.runtime, probe.steps.tracker, probe.transport.publisher; "
                                "probe.attach()"))
    assert "textual" not in mods and "flowtop" not in mods


RUNTIME_CHECKED = [*data_side(), *sorted(ENTRY_POINTS)]


@pytest.mark.parametrize("module", RUNTIME_CHECKED)
def test_monitor_module_imports_without_textual_or_torch(module: str) -> None:
    loaded = _modules_after_import(module)
    assert "textual" not in _tops(loaded)
    assert "torch" not in _tops(loaded)  # the monitor runs on login nodes without torch
    # From probe, the monitor may import only the wire schema (and the probe's logger).
    probe_mods = {m for m in loaded if _top(m) == "probe"}
    assert {m for m in probe_mods if not m.startswith("probe.wire.")} <= {"probe", "probe.wire", "probe._log"}
    # `probe` itself is in sys.modules as the parent package of probe.wire; its __init__ must
    # then not have imported torch (checked above) nor zmq's publisher side.
    assert "probe.runtime" not in probe_mods and "probe.transport.publisher" not in probe_mods


def test_snapshot_data_path_imports_without_textual() -> None:
    mods = _tops(_modules_after("from flowtop.monitor.wiring import make_model; m = make_model(); m.tick(0.5); "
                                "m.snapshot(0.0)"))
    assert "textual" not in mods and "torch" not in mods


def test_the_data_thread_runs_a_collector_without_textual() -> None:
    """The data thread hosts the collector (sockets, ticks, hints) with no UI module loaded."""
    code = ("from flowtop.monitor.collector import Collector; from flowtop.monitor.datathread import DataThread; "
            "from flowtop.tools.demo.launch import free_port_pair; from flowtop.monitor.wiring import make_model; "
            "d = DataThread(Collector(make_model(), f'tcp://127.0.0.1:{free_port_pair()}'), cadence_s=0.05); "
            "d.start().result(10); import time; time.sleep(0.3); d.refresh().result(10); d.stop()")
    mods = _tops(_modules_after(code))
    assert "textual" not in mods and "torch" not in mods
