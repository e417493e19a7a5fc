"""Tests that can fail: every test asserts something (issue "one of each", item 5).

Each ``test_*`` function in tests/test_*.py (and the tests tests/support declares for the modules to
collect) must contain, somewhere in its body, one of:

- an ``assert`` statement;
- ``pytest.raises`` / ``pytest.warns`` / ``pytest.fail``;
- a call to a helper whose name starts with ``assert_``, ``check_`` or ``expect_`` (helpers that
  assert are named so), or to a function the test defines itself that does one of these.

An ``assert`` whose condition is a non-empty constant, or ``… or <non-empty constant>``, or a
parenthesised ``(condition, message)`` tuple, cannot fail and does not count: it is reported.

A test that truly needs none of this goes into :data:`EXCEPTIONS` with the reason.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
HELPER_PREFIXES = ("assert_", "check_", "expect_")
PYTEST_CHECKS = {"raises", "warns", "fail", "deprecated_call"}

# "<file>::<test name>" -> why it asserts nothing that this module can see
EXCEPTIONS: dict[str, str] = {}


def _call_name(call: ast.Call) -> tuple[str, str]:
    """(base, name) of the called thing: ``pytest.raises`` -> ("pytest", "raises"); ``f`` -> ("", "f")."""
    func = call.func
    if isinstance(func, ast.Name):
        return "", func.id
    if isinstance(func, ast.Attribute):
        base = func.value.id if isinstance(func.value, ast.Name) else ""
        return base, func.attr
    return "", ""


def _always_true(node: ast.expr) -> bool:
    """An assert condition that can never be false: a truthy constant, a non-empty tuple, ``x or <such>``."""
    if isinstance(node, ast.Constant):
        return bool(node.value)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
        return bool(node.elts) if not isinstance(node, ast.Dict) else bool(node.keys)
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.Constant) and v.value for v in node.values)
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return any(_always_true(v) for v in node.values)
    return False


def _own_nodes(fn: ast.AST):
    """The nodes of ``fn``'s body, nested blocks included, nested function/class bodies excluded."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _checks(fn: ast.AST, local_checkers: set[str]) -> list[ast.AST]:
    """The nodes of ``fn`` that can make it fail."""
    found: list[ast.AST] = []
    for node in _own_nodes(fn):
        if isinstance(node, ast.Assert) and not _always_true(node.test):
            found.append(node)
        elif isinstance(node, ast.Call):
            base, name = _call_name(node)
            if (
                (base == "pytest" and name in PYTEST_CHECKS)
                or name.startswith(HELPER_PREFIXES)
                or (not base and name in local_checkers)
            ):
                found.append(node)
    return found


def problems(source: str, filename: str, excused: set[str] | None = None) -> list[str]:
    """One line per test in ``source`` that asserts nothing, or asserts something that cannot fail.

    Tests listed in :data:`EXCEPTIONS` are not reported; those that needed it are added to ``excused``.
    """
    tree = ast.parse(source, filename)
    out: list[str] = []

    memo: dict[tuple[int, frozenset[str]], set[str]] = {}

    def checkers_in(scope: ast.AST, inherited: set[str]) -> set[str]:
        """``inherited`` and the functions defined right in ``scope`` that check something."""
        key = (id(scope), frozenset(inherited))
        if key not in memo:
            defs = [n for n in _own_nodes(scope) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            local = set(inherited)
            while True:  # a helper may call another helper of the same scope
                more = {d.name for d in defs if d.name not in local and _checks(d, checkers_in(d, local))}
                if not more:
                    break
                local |= more
            memo[key] = local
        return memo[key]

    def visit(scope: ast.AST, checkers: set[str]) -> None:
        defs = [n for n in _own_nodes(scope) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        local = checkers_in(scope, checkers)
        for node in _own_nodes(scope):
            if isinstance(node, ast.Assert) and _always_true(node.test):
                where = f"{filename}:{node.lineno}"
                out.append(f"{where}: `assert {ast.unparse(node.test)[:60]}` can never fail")
        for d in defs:
            if not d.name.startswith("test_") or _checks(d, checkers_in(d, local)):
                continue
            if f"{filename}::{d.name}" in EXCEPTIONS:
                if excused is not None:
                    excused.add(f"{filename}::{d.name}")
                continue
            out.append(
                f"{filename}:{d.lineno} {d.name}: no assert, no pytest.raises/warns/fail, and no call "
                f"to an assert_/check_/expect_ helper"
            )
        for d in defs:
            visit(d, local)
        for c in (n for n in _own_nodes(scope) if isinstance(n, ast.ClassDef)):
            visit(c, local)

    visit(tree, set())
    return out


def _sources() -> list[Path]:
    return sorted(TESTS.glob("test_*.py")) + sorted((TESTS / "support").glob("*.py"))


def test_every_test_asserts_something_that_can_fail() -> None:
    files = _sources()
    assert len(files) > 20, files
    excused: set[str] = set()
    found = [
        line
        for path in files
        for line in problems(path.read_text(encoding="utf-8"), str(path.relative_to(TESTS.parent)), excused)
    ]
    assert not found, "tests that cannot fail:\n  " + "\n  ".join(found)
    # an exception is kept only while its test exists and still asserts nothing, and it says why
    stale = sorted(set(EXCEPTIONS) - excused)
    assert not stale, f"EXCEPTIONS name tests that are gone or assert now: {stale}"
    assert all(len(why) > 20 for why in EXCEPTIONS.values()), "each exception says why its test needs no assert"


def test_test_modules_import_only_conftest_and_support() -> None:
    bad = []
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                names = [a.name for a in node.names] if node.module in (None, "tests") else []
                if (
                    module.lstrip(".").startswith("test_")
                    or module.startswith("tests.test_")
                    or any(n.startswith("test_") for n in names)
                ):
                    bad.append(f"{path.name}:{node.lineno} imports from {module}")
            elif isinstance(node, ast.Import):
                bad += [
                    f"{path.name}:{node.lineno} imports {a.name}"
                    for a in node.names
                    if a.name.startswith("tests.test_")
                ]
    assert bad == [], bad


# -- the checker itself finds what it must ------------------------------------------------------------

SAMPLE = textwrap.dedent("""
    import pytest

    def test_asserts():
        assert 1 + 1 == 2

    def test_only_prints():
        print("ok")

    def test_raises():
        with pytest.raises(ValueError):
            int("x")

    def test_helper():
        assert_all_fine(3)

    def test_nested_block():
        for x in range(3):
            if x:
                assert x > 0

    def test_always_true(f):
        assert "{" in f.message or f.message or True

    def test_tuple():
        assert (1 == 2, "never checked")

    def test_swallowed():
        try:
            run()
        except Exception:
            pass

    def test_local_helper():
        def ok(x):
            assert x
        ok(1)

    def test_helper_never_called():
        def ok(x):
            assert x

    class TestGroup:
        def test_method(self):
            self.value = 1
""")


def test_the_checker_names_each_test_that_cannot_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EXCEPTIONS, "sample.py::test_excused", "only the tool's own exit code matters here")
    excused: set[str] = set()
    found = problems(SAMPLE + "\ndef test_excused():\n    run()\n", "sample.py", excused)
    assert excused == {"sample.py::test_excused"}
    named = {line.split()[1].rstrip(":") for line in found if "no assert" in line}
    assert named == {
        "test_only_prints",
        "test_always_true",
        "test_tuple",
        "test_swallowed",
        "test_helper_never_called",
        "test_method",
    }
    never = [line for line in found if "can never fail" in line]
    assert len(never) == 2, never
    assert any("or True" in line for line in never) and any("never checked" in line for line in never)
    assert all(line.startswith("sample.py:") for line in found)


def test_the_checker_accepts_every_way_of_asserting() -> None:
    ok = textwrap.dedent("""
        import pytest
        def test_a(): pytest.fail("x")
        def test_b():
            with pytest.warns(UserWarning): pass
        def test_c(): check_report(1)
        def test_d(): expect_top("TD150")
        def test_e(x): mod.assert_fixed(x)
    """)
    assert problems(ok, "ok.py") == []


@pytest.mark.parametrize("cond", ["True", "1", "'text'", "(a, 'msg')", "a or True", "f'{a}x'"])
def test_constant_conditions_never_fail(cond: str) -> None:
    assert _always_true(ast.parse(cond, mode="eval").body)


@pytest.mark.parametrize("cond", ["a", "a or b", "a and True", "not True", "''", "0", "f'{a}'", "()"])
def test_real_conditions_can_fail(cond: str) -> None:
    assert not _always_true(ast.parse(cond, mode="eval").body)
