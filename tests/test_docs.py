"""docs/ against the code: the wire schema page lists exactly the schema's kinds and fields, the
peak table is the code's, links resolve, and no comment cites notes outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from probe import wire
from probe.flops import peaks
from probe.wire import steps as wire_steps
from probe.wire.schema import SCHEMA

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
WIRE = DOCS / "wire.md"
ROW = re.compile(r"^\| `([a-z_]+)` \| (yes|no) \|")


def _tables(path: Path) -> dict[str, dict[str, bool]]:
    """Heading (its first backticked word, else its text) -> {field: required} of the table under it."""
    out: dict[str, dict[str, bool]] = {}
    current = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            m = re.search(r"`([a-z_]+)`", line)
            current = m.group(1) if m else line.lstrip("# ").strip()
        elif (m := ROW.match(line)) and current:
            out.setdefault(current, {})[m.group(1)] = m.group(2) == "yes"
    return out


def test_wire_page_lists_every_kind_and_field() -> None:
    tables = _tables(WIRE)
    for kind, schema in SCHEMA.items():
        if kind == "stepcols":
            continue  # validated as a whole: checked against probe.wire.steps below
        assert tables.get(kind) == {name: required for name, (required, _) in schema.items()}, kind
    documented_kinds = {k for k in tables if k in wire.KINDS}
    assert documented_kinds == set(wire.KINDS)


def test_wire_page_lists_the_stepcols_columns() -> None:
    cols = _tables(WIRE)["stepcols"]
    required = {name for name, _ in wire_steps.REQUIRED} | {"n", "drops"}
    optional = set(wire_steps.OPTIONAL) | {"device_s", "commands_refused", "commands_dropped"}
    assert {n for n, r in cols.items() if r} == required
    assert {n for n, r in cols.items() if not r} == optional
    # Every field a stepcols frame carries is one of those (the encoder is the reference).
    rec = {"step": 1, "wall_s": 0.1, "tokens": 8, "input_wait_s": 0.0, "lead_s": 0.0, "probe_s": 0.0,
           "stage_s": 0.0, "device_s": 0.05, "commands_refused": 1, "commands_dropped": 1}
    assert set(wire_steps.encode_fields([rec], 0)) == required | optional


def test_wire_page_envelope_and_version() -> None:
    text = WIRE.read_text(encoding="utf-8")
    assert f"Schema version: **{wire.MAJOR}.{wire.MINOR}** (MAJOR {wire.MAJOR}, MINOR {wire.MINOR})" in text
    envelope = _tables(WIRE)["Envelope (every kind)"]
    assert set(envelope) == {"v", "k", *wire._ENVELOPE} and all(envelope.values())
    commands = re.findall(r"^\| `([a-z_]+)` \|", text.split("## Commands", 1)[1], flags=re.M)
    assert commands == list(wire.CONTROL_COMMANDS)


def test_the_table_parser_can_fail() -> None:
    tables = _tables(WIRE)
    assert tables["bye"] == {"reason": True, "steps": True, "drops": True}
    assert tables["telemetry"]["reasons"] is False


def test_design_page_holds_the_peak_table() -> None:
    assert peaks.markdown_table() in (DOCS / "design.md").read_text(encoding="utf-8")


def _slug(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")) + ["../README.md"])
def test_links_resolve(page: str) -> None:
    path = (DOCS / page).resolve()
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{page}: {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page}: {target}"


def test_readme_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        assert f"(docs/{page.name})" in readme, page.name


def test_no_comment_cites_notes_outside_the_repository() -> None:
    cited = re.compile(r"(?<!docs/)design\.md|design §")
    hits = []
    for top in ("flowtop", "probe", "tests", "bench"):
        for path in (ROOT / top).rglob("*.py"):
            if path.name == "test_docs.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if cited.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{n}")
    assert not hits, hits


def test_readme_says_what_a_step_time_is_where_the_json_lists_it() -> None:
    """A trial: the job's step_time_s being the slowest rank's median was said only in the
    Prometheus table, and no section said a rank's is a median of how many steps."""
    from flowtop.monitor.rankstate import MEDIAN_STEPS

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    conventions = readme.split("## FLOP conventions", 1)[1].split("\n## ", 1)[0]
    json_section = readme.split("## Snapshot JSON", 1)[1].split("\n## ", 1)[0]
    assert f"the median wall time of its last {MEDIAN_STEPS} steps" in " ".join(conventions.split())
    said = " ".join(json_section.split())
    assert f"a rank's `step_time_s` is the median wall time of its last {MEDIAN_STEPS} steps" in said
    assert "a job's `step_time_s` the slowest live rank's median" in said


def test_the_code_the_docs_name_is_where_they_say() -> None:
    """A `flowtop.module.func()` the docs name resolves, and a `probe/file.py` `name` pair names a
    file that defines it (README named flowtop.monitor.snapshot.json_schema(), which is in
    snapshot_json; docs/wire.md put hello_step in probe/steps/tracker.py, which is in walls.py)."""
    import importlib

    bad = []
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = path.read_text()
        for m in re.finditer(r"`((?:flowtop|probe)(?:\.\w+)+)\(\)`", text):
            parts = m.group(1).split(".")
            for i in range(len(parts) - 1, 0, -1):  # the longest importable module, then attributes
                try:
                    obj: object = importlib.import_module(".".join(parts[:i]))
                except ImportError:
                    continue
                for attr in parts[i:]:
                    obj = getattr(obj, attr, None)
                if not callable(obj):
                    bad.append((path.name, m.group(1)))
                break
        for m in re.finditer(r"`((?:flowtop|probe)/[\w/]+\.py)` `(\w+)`", text):
            file = ROOT / m.group(1)
            if not file.exists() or not re.search(rf"^\s*(def|class) {m.group(2)}\b|^{m.group(2)}\s*=",
                                                  file.read_text(), re.M):
                bad.append((path.name, f"{m.group(1)} {m.group(2)}"))
    assert not bad
