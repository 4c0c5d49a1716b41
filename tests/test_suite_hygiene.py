"""The suite itself (issue 12 part 5): every test can fail, and every skip says why.

Read from the test modules' syntax trees, so a new test is held to it without being listed.
"""

from __future__ import annotations

import ast
import sys
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: pytest functions that are themselves a check (a test that uses one can fail).
CHECKS = {"raises", "fail", "warns"}


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _callee(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f"{ast.unparse(f.value)}.{f.attr}"
    return ""


def _asserts(fn: ast.AST, helpers: set[str]) -> bool:
    """Whether ``fn`` asserts: an assert statement, a pytest check, a mock's ``assert_*`` or
    torch.testing's ``assert_close``, or a call to a helper that asserts."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = _callee(node)
            last = name.rpartition(".")[2]
            if (name.startswith("pytest.") and last in CHECKS) or last.startswith("assert"):
                return True
            if name in helpers:
                return True
    return False


def _helpers(path: Path) -> dict[str, ast.AST]:
    """Functions a test of ``path`` may call by name: its own and those it imports from the
    helper modules in tests/ (conftest.py, *_helpers.py, ...)."""
    tree = _tree(path)
    found: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("test_"):
            found[node.name] = node
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and (HERE / f"{node.module}.py").exists():
            other = _tree(HERE / f"{node.module}.py")
            defs = {n.name: n for n in ast.walk(other) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for alias in node.names:
                if alias.name in defs:
                    found[alias.asname or alias.name] = defs[alias.name]
    return found


def unchecked_tests() -> list[str]:
    missing = []
    for path in sorted(HERE.glob("test_*.py")):
        helpers = _helpers(path)
        asserting: set[str] = set()
        for _ in range(4):  # helpers calling helpers
            asserting |= {name for name, fn in helpers.items() if _asserts(fn, asserting)}
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                if not _asserts(node, asserting):
                    missing.append(f"{path.name}:{node.lineno} {node.name}")
    return missing


def test_every_test_asserts_something() -> None:
    assert unchecked_tests() == []


def test_the_scan_finds_a_test_without_a_check(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The check above can fail: a test that only runs code is reported, one that calls an
    asserting helper is not."""
    (tmp_path / "test_fake.py").write_text(
        "def _check(x):\n    assert x\n\n"
        "def test_runs_only():\n    sum([1, 2])\n\n"
        "def test_via_helper():\n    _check(1)\n\n"
        "def test_raises():\n    import pytest\n    with pytest.raises(ValueError):\n        int('x')\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "HERE", tmp_path)
    assert unchecked_tests() == ["test_fake.py:4 test_runs_only"]


def _skips(path: Path) -> list[tuple[int, str, ast.Call]]:
    out = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call):
            name = _callee(node)
            if name in ("pytest.skip", "pytest.importorskip", "pytest.mark.skipif", "pytest.mark.skip", "pytest.xfail",
                        "pytest.mark.xfail"):  # fmt: skip
                out.append((node.lineno, name, node))
    return out


def test_every_skip_says_why_and_cuda_goes_through_the_gpu_marker() -> None:
    bad = []
    for path in sorted(HERE.glob("*.py")):
        for line, name, call in _skips(path):
            kw = {k.arg for k in call.keywords}
            if name == "pytest.importorskip":
                says_why = "reason" in kw
            elif name == "pytest.skip":
                says_why = bool(call.args) or "reason" in kw
            else:
                says_why = "reason" in kw or (name == "pytest.mark.skip" and bool(call.args))
            if not says_why:
                bad.append(f"{path.name}:{line} {name} without a reason")
            if "cuda" in ast.unparse(call) and "is_available" in ast.unparse(call):
                bad.append(f"{path.name}:{line} {name} on CUDA: mark the test @pytest.mark.gpu instead")
    assert bad == []
