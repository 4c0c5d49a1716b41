"""One configuration module per side, and the README's tables generated from them.

probe/config.py holds every variable the probe reads, flowtop/settings.py every one the monitor
reads (and the probe's that its tools set); no other module reads a FLOWTOP_* variable, and the
README shows exactly the tables those modules render.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from flowtop import cli, settings
from flowtop.tools.cli_args import build_parser
from probe import config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NAME = re.compile(r"FLOWTOP_[A-Z0-9_]+")
#: Reads outside the two modules, each for a reason: the bootstrap decides before anything of the
#: probe may be imported; doctor's child reports the training's raw value and must not import flowtop.
ALLOWED = {
    ("probe/bootstrap/sitecustomize.py", "FLOWTOP_DISABLE"),
    ("flowtop/tools/doctor_child.py", "FLOWTOP_DISABLE"),
}
ENV_METHODS = {"get", "setdefault", "pop", "getenv", "putenv", "unsetenv"}


def _env_names_used(tree: ast.AST) -> set[str]:
    """FLOWTOP_* names a module reads or writes in a mapping: ``x.get("FLOWTOP_…")``,
    ``x["FLOWTOP_…"]``, ``"FLOWTOP_…" in x`` (messages that mention a name do not count)."""
    found: set[str] = set()

    def name_of(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
            return node.value
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            method = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if method in ENV_METHODS and (n := name_of(node.args[0])):
                found.add(n)
        elif isinstance(node, ast.Subscript) and (n := name_of(node.slice)):
            found.add(n)
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            where = node.comparators[0]  # an environment, not a message searched for the name
            mapping = where.attr if isinstance(where, ast.Attribute) else where.id if isinstance(where, ast.Name) else ""
            if mapping in ("environ", "env") and (n := name_of(node.left)):
                found.add(n)
    return found


def _uses(package: str, home: str) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel != home:
            out |= {(rel, name) for name in _env_names_used(ast.parse(path.read_text(encoding="utf-8")))}
    return out


@pytest.mark.parametrize(("package", "home"), [("probe", "probe/config.py"), ("flowtop", "flowtop/settings.py")])
def test_no_module_but_the_configuration_reads_a_flowtop_variable(package: str, home: str) -> None:
    stray = sorted(_uses(package, home) - ALLOWED)
    assert not stray, f"read these through {home}: {stray}"


def test_the_scan_sees_reads() -> None:
    """The scan above can fail: each way of reading a variable is found."""
    code = ('import os\nos.environ.get("FLOWTOP_A")\nos.environ["FLOWTOP_B"] = "1"\nos.getenv("FLOWTOP_C")\n'
            'env.setdefault("FLOWTOP_D", "0")\n"FLOWTOP_E" in os.environ\nprint("set FLOWTOP_F=1")\n'
            '"FLOWTOP_G" in reason\n')
    assert _env_names_used(ast.parse(code)) == {"FLOWTOP_A", "FLOWTOP_B", "FLOWTOP_C", "FLOWTOP_D", "FLOWTOP_E"}


def test_readme_holds_the_probe_table() -> None:
    assert config.markdown_table() in README.read_text(encoding="utf-8")


def test_readme_holds_the_monitor_tables() -> None:
    assert settings.markdown_tables() in README.read_text(encoding="utf-8")


def test_every_probe_variable_is_in_the_probe_table() -> None:
    probe_names = {v.name for v in config.VARIABLES}
    assert len(probe_names) == len(config.VARIABLES)
    table = config.markdown_table()
    assert all(f"`{n}`" in table for n in probe_names)
    # The module attributes are the records the table lists (none defined and left out).
    records = {v.name for v in vars(config).values() if isinstance(v, config.Var)}
    assert records == probe_names


def test_the_tools_set_only_variables_the_probe_reads() -> None:
    probe_names = {v.name for v in config.VARIABLES}
    set_for_probe = {p.name for p in settings.FOR_PROBE} - {settings.CALIBRATE_STEPS.name}
    assert set_for_probe <= probe_names
    assert settings.CALIBRATE_STEPS.name not in probe_names  # said so in its row: the probe ignores it
    # The monitor's own reads of the probe's variables mean the same thing.
    assert (settings.ADDR.name, settings.ADDR.default) == (config.ADDR.name, config.ADDR.default)
    assert settings.CURVE_DIR.name == config.CURVE_DIR.name
    records = {v.name for v in vars(settings).values() if isinstance(v, settings.Setting)}
    assert records == {s.name for s in settings.MONITOR}


def test_the_bootstrap_spells_on_as_the_configuration_does() -> None:
    """sitecustomize reads FLOWTOP_DISABLE itself (before the probe is importable): same words."""
    tree = ast.parse((ROOT / "probe/bootstrap/sitecustomize.py").read_text(encoding="utf-8"))
    words = [ast.literal_eval(n.comparators[0]) for n in ast.walk(tree) if isinstance(n, ast.Compare)
             and isinstance(n.ops[0], ast.NotIn) and "FLOWTOP_DISABLE" in ast.dump(n.left)]
    assert words == [config.TRUE_WORDS]


def test_hang_floor_default_shown_is_the_rules() -> None:
    from flowtop.monitor.hints.rules import RULES

    floors = {r.params["floor_s"] for r in RULES if r.id.startswith("hang")}
    assert floors == {30.0} and settings.HANG_S.shown_default.startswith("`30`")


def test_bad_values_fall_back_to_the_default(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from probe import _log

    monkeypatch.setattr(_log, "_seen", set())  # "once per process": leave other tests their first warning
    assert config.QUEUE.read({"FLOWTOP_QUEUE": "many"}) == 10_000
    assert config.QUEUE.read({"FLOWTOP_QUEUE": "many"}) == 10_000
    # once per process, saying what it wanted (not "invalid literal for int() with base 10")
    assert capsys.readouterr().err.count("ignoring FLOWTOP_QUEUE='many': expected a whole number; using 10000") == 1
    assert config.JOB.read({"FLOWTOP_JOB": ""}) is None and config.JOB.read({"FLOWTOP_JOB": "j"}) == "j"
    # A variable whose default is "not set" says so, not "using None" (a new user's trial).
    assert config.FLOPS_PER_TOKEN.read({"FLOWTOP_FLOPS_PER_TOKEN": "-3"}) is None
    err = capsys.readouterr().err
    assert "ignoring FLOWTOP_FLOPS_PER_TOKEN='-3'" in err and err.rstrip().endswith("as if it were unset"), err
    with caplog.at_level(logging.WARNING):
        assert settings.HANG_S.read({"FLOWTOP_HANG_S": "soon"}) is None
        assert settings.HANG_S.read({"FLOWTOP_HANG_S": " 12 "}) == 12.0
        assert settings.ADDR.read({"FLOWTOP_ADDR": " "}) == settings.ADDR.default
    assert "flowtop: ignoring FLOWTOP_HANG_S='soon'" in caplog.text  # named as flowtop's on stderr


def test_the_monitor_reads_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWTOP_ADDR", "tcp://127.0.0.1:7001")
    assert build_parser().parse_args(["top"]).listen == "tcp://127.0.0.1:7001"
    assert build_parser().parse_args(["relay"]).connect == "tcp://127.0.0.1:7001"
    monkeypatch.setenv("FLOWTOP_HANG_S", "7")
    from flowtop.monitor.wiring import hint_overrides_from_env

    assert hint_overrides_from_env() == {"hang": {"floor_s": 7.0}}


def test_the_data_threads_cpu_budget_comes_from_the_flag_the_variable_or_pacing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """--data-cpu wins over FLOWTOP_DATA_CPU, which wins over pacing.DATA_CPU; the collector's pacer
    and thinner both get it (none from a core up: a thread cannot take more); a bad variable is
    said once and the default used."""
    from flowtop.monitor import pacing

    monkeypatch.delenv("FLOWTOP_DATA_CPU", raising=False)
    assert build_parser().parse_args(["serve"]).data_cpu == pacing.DATA_CPU == 0.5
    monkeypatch.setenv("FLOWTOP_DATA_CPU", "1.5")
    args = build_parser().parse_args(["top", "--listen", "tcp://127.0.0.1:7002"])
    assert args.data_cpu == 1.5
    assert build_parser().parse_args(["snapshot", "--data-cpu", "0.25"]).data_cpu == 0.25
    collector = cli._collector(args)  # a core or more: keeping up alone decides
    assert collector.pacer.cpu_budget is None and collector.thinner.cpu_budget is None
    args = build_parser().parse_args(["top", "--listen", "tcp://127.0.0.1:7002", "--data-cpu", "0.3"])
    collector = cli._collector(args)
    assert collector.pacer.cpu_budget == collector.thinner.cpu_budget == 0.3
    monkeypatch.setenv("FLOWTOP_DATA_CPU", "-1")
    with caplog.at_level(logging.WARNING):
        assert build_parser().parse_args(["top"]).data_cpu == 0.5
    assert caplog.text.count("ignoring FLOWTOP_DATA_CPU='-1'") == 1


def test_the_demo_sets_no_variable_nobody_reads() -> None:
    text = (ROOT / "flowtop/tools/demo/launch.py").read_text(encoding="utf-8")
    assert "FLOWTOP_DEMO" not in text and "port + 1" not in text


# --- analyze and calibrate go through the one argument parser ---------------------------------

TRACE = ROOT / "tests/data/h200-gpt-small-step.trace.json.gz"


def test_analyze_is_a_subcommand_of_the_parser() -> None:
    args = build_parser().parse_args(["analyze", str(TRACE), "--json", "--top", "3", "--sort", "calls"])
    assert (args.cmd, args.json, args.top, args.sort, args.step_ms) == ("analyze", True, 3, "calls", None)
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["analyze", str(TRACE), "--sort", "nonsense"])
    assert exc.value.code == 2


@pytest.mark.skipif(not TRACE.exists(), reason="H200 trace fixture not present")
def test_flowtop_analyze_prints_what_analyze_main_prints() -> None:
    from flowtop.tools import analyze

    outs = []
    for run in (lambda: cli.main(["analyze", str(TRACE), "--json", "--top", "3"]),
                lambda: analyze.main([str(TRACE), "--json", "--top", "3"])):
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert run() == 0
        outs.append(buf.getvalue())
    assert outs[0] == outs[1] and len(json.loads(outs[0])["kernels"]) == 3


def test_calibrate_is_a_subcommand_of_the_parser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flowtop.tools import calibrate

    args = build_parser().parse_args(["calibrate", "--steps", "2", "--skip", "10", "--", "python", "t.py",
                                      "--steps", "9"])
    assert (args.cmd, args.steps, args.skip) == ("calibrate", 2, 10)
    assert args.command[-4:] == ["python", "t.py", "--steps", "9"]  # CMD keeps its own options
    for bad in (["--steps", "2"], ["--skip", "1", "--", "python"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["calibrate", *bad])
        assert exc.value.code == 2
    assert "usage: flowtop calibrate" in capsys.readouterr().err
    missing = tmp_path / "no-ncu"
    assert cli.main(["calibrate", "--ncu", str(missing), "--", "python", "x.py"]) == calibrate.EXIT_NO_TOOLS
