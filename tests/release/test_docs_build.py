"""The documentation site (docs/conf.py): Sphinx builds it with warnings as errors, the doctest
builder runs its Python code blocks, and every public name, with its public methods and
properties, is in the API reference."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.release, pytest.mark.timeout(300)]


def _sphinx(builder: str, out: Path) -> None:
    # The reference documents bmq.spark too, which imports pyspark and pyarrow (the spark extra).
    for module, extra in (("sphinx", "docs"), ("myst_parser", "docs"), ("pyspark", "spark"), ("pyarrow", "spark")):
        if importlib.util.find_spec(module) is None:
            reason = f"{module} not installed (the {extra} extra: pip install -e '.[{extra}]')"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"{reason} (required under CI=true)")
            pytest.skip(reason)
    result = subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", builder,
                             "-d", str(out / "doctrees"), "docs", str(out / builder)],
                            cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, (result.stdout + result.stderr)[-8000:]


def _inventory(path: Path) -> Set[str]:
    """The object names in a Sphinx ``objects.inv`` (version 2: four header lines, then zlib)."""
    data = path.read_bytes()
    body = data.split(b"\n", 4)[4]
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines() if line}


def _reference_modules() -> List[str]:
    """``PUBLIC_MODULES`` of docs/conf.py (read, not imported: importing it writes the pages)."""
    tree = ast.parse((ROOT / "docs" / "conf.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PUBLIC_MODULES"
                                                for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("docs/conf.py defines no PUBLIC_MODULES")


def public_names() -> Iterator[Tuple[str, str]]:
    """(name as imported, where its members are documented) for every public name and member."""
    import bmq.exceptions

    for module_name in _reference_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                continue
            qualified = f"{module_name}.{name}"
            yield qualified, qualified
            if not inspect.isclass(obj):
                continue
            home = f"bmq.exceptions.{name}" if module_name == "bmq" and name in bmq.exceptions.__all__ else qualified
            for member, value in vars(obj).items():
                if not member.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                    yield f"{qualified}.{member}", f"{home}.{member}"


def test_docs_build_without_warnings_and_document_every_public_name(tmp_path: Path) -> None:
    _sphinx("html", tmp_path)
    documented = _inventory(tmp_path / "html" / "objects.inv")
    missing = [name for name, home in public_names() if home not in documented]
    assert not missing, f"public names missing from the API reference: {missing}"
    for page in ("_generated/tour.html", "_generated/examples.html", "changelog.html", "subscriptions.html",
                 "_generated/api/bmq.html"):
        assert (tmp_path / "html" / page).is_file(), page


def test_docs_code_blocks_run(tmp_path: Path) -> None:
    _sphinx("doctest", tmp_path)
    report = (tmp_path / "doctest" / "output.txt").read_text()
    assert "0 failures in tests" in report and " 0 tests" not in report, report


def test_every_public_package_is_in_the_reference() -> None:
    """A new public package of bmq (a directory not starting with ``_``) must be added to
    ``PUBLIC_MODULES`` in docs/conf.py (and so to the reference); bmq.cli is the command line,
    documented in the README."""
    packages = {f"bmq.{path.parent.name}" for path in (ROOT / "bmq").glob("*/__init__.py")
                if not path.parent.name.startswith("_")}
    missing = sorted((packages | {"bmq", "bmq.events", "bmq.exceptions"}) - set(_reference_modules()))
    assert not missing, f"public packages missing from PUBLIC_MODULES in docs/conf.py: {missing}"
