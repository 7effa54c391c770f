"""The house rules a tool can check, kept so by this test (the import layering is
lint-imports' job, run by `make test`):

- code and documents speak of what is: no issue numbers in them (an issue number means
  nothing to a reader of the repository);
- every module of the broker says its role in a docstring;
- a test helper is defined once: no two test modules define a top-level function or class of
  the same name and nearly the same body (shared ones live in tests/helpers.py,
  tests/harness.py, tests/wire.py, tests/<component>/helpers.py and the conftest.py files);
- no test module imports from another test module: what two of them share lives in a
  helpers module or a conftest.py, so that running one test file never collects another's.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections import defaultdict
from pathlib import Path

from tests.harness import PROJECT

ROOT = Path(PROJECT)
PACKAGES = ("broker", "workers", "shm", "loadtest", "pipeline", "tests")
DOCUMENTS = ("README.md", "ARCHITECTURE.md", "Makefile", "pyproject.toml")
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+\b|\(item \d+\)", re.IGNORECASE)
# Two definitions are copies when their code (without docstrings) is the same, or when it is
# longer than a line or two and difflib finds it this alike (short fixtures that differ in
# their configuration alone look alike and are not copies).
SAME_BODY, SHORT = 0.8, 200


def _sources(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (ROOT / package).rglob("*.py")
                  if ".venv" not in path.parts and "__pycache__" not in path.parts)


def test_no_issue_numbers_in_code_or_documents():
    found = []
    for path in [*_sources(*PACKAGES), *(ROOT / name for name in DOCUMENTS)]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ISSUE_NUMBER.search(line) and path.name != "test_house.py":
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_every_broker_module_says_its_role():
    silent = [str(path.relative_to(ROOT)) for path in _sources("broker", "workers", "shm")
              if path.stat().st_size and ast.get_docstring(ast.parse(path.read_text())) is None]
    assert silent == []


def _code(node) -> str:
    """A definition's code without its docstring."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    return "\n".join(ast.unparse(statement) for statement in body)


def test_each_test_helper_is_defined_once():
    defined = defaultdict(list)
    for path in _sources("tests"):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    and not node.name.startswith(("test_", "Test"))):
                defined[node.name].append((path.name, _code(node)))
    copies = []
    for name, places in defined.items():
        for index, (first, code) in enumerate(places):
            for second, other in places[index + 1:]:
                if code == other or (min(len(code), len(other)) > SHORT and difflib.SequenceMatcher(
                        None, code, other).ratio() >= SAME_BODY):
                    copies.append(f"{name}: {first} and {second}")
    assert copies == []


def _imported_modules(tree: ast.Module) -> set[str]:
    """The modules a module's code imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_test_module_imports_another():
    borrowing = []
    for path in _sources("tests"):
        for module in sorted(_imported_modules(ast.parse(path.read_text()))):
            if module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_"):
                borrowing.append(f"{path.relative_to(ROOT)} imports {module}")
    assert borrowing == []
