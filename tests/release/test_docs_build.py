"""The documentation site (docs/conf.py): Sphinx builds it with warnings as errors with the docs
extra alone (no pyspark), the doctest builder runs its Python code blocks, every public name,
with its public methods and properties, is in the API reference, and the reference renders
cleanly (no garbled napoleon fields, no constructor an application must not call)."""
from __future__ import annotations

import ast
import html
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPARK_DEPENDENCIES = ("pyspark", "pyarrow", "pandas")

pytestmark = [pytest.mark.release, pytest.mark.timeout(300)]

# Runs Sphinx in a process where the Spark extra's packages cannot be imported, even when they
# are installed: the site must build with the docs extra alone (docs/conf.py mocks them).
_WITHOUT_SPARK = """
import importlib.abc, sys

class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by the test)", name=name)
        return None

sys.meta_path.insert(0, _Absent())
from sphinx.cmd.build import main
sys.exit(main(sys.argv[1:]))
"""


def _require(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            reason = f"{module} not installed (the docs extra: pip install -e '.[docs]')"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"{reason} (required under CI=true)")
            pytest.skip(reason)


def _sphinx(builder: str, out: Path, *, without_spark: bool = False) -> None:
    _require("sphinx", "myst_parser", "furo")
    runner = ["-c", _WITHOUT_SPARK.format(names=SPARK_DEPENDENCIES)] if without_spark else ["-m", "sphinx"]
    result = subprocess.run([sys.executable, *runner, "-E", "-W", "--keep-going", "-q", "-b", builder,
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


def _import(module_name: str):
    """The module, on Sphinx's mocks of the Spark extra's packages when they are absent (as
    docs/conf.py imports it)."""
    from sphinx.ext.autodoc.mock import mock

    absent = [name for name in SPARK_DEPENDENCIES if importlib.util.find_spec(name) is None]
    with mock(absent):
        return importlib.import_module(module_name)


# The first words of a queue method that only the session's units call (docs/conf.py leaves
# these out of the reference).
SESSION_SIDE = "Session side (not public API)"


def public_names() -> Iterator[Tuple[str, str]]:
    """(name as imported, where its members are documented) for every public name and member."""
    import bmq.exceptions

    for module_name in _reference_modules():
        module = _import(module_name)
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
                if (not member.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))
                        and not (getattr(value, "__doc__", None) or "").startswith(SESSION_SIDE)):
                    yield f"{qualified}.{member}", f"{home}.{member}"


GUIDE = ["getting-started", "producing", "consuming", "subscriptions", "threads", "high-availability", "outbox",
         "security", "observability", "asyncio", "spark", "compat", "broker-and-admin", "cli", "benchmarks"]


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_docs_build_without_spark_and_document_every_public_name(tmp_path: Path) -> None:
    _sphinx("html", tmp_path, without_spark=True)
    site = tmp_path / "html"
    documented = _inventory(site / "objects.inv")
    missing = [name for name, home in public_names() if home not in documented]
    assert not missing, f"public names missing from the API reference: {missing}"
    pages = ["_generated/tour", "_generated/examples", "changelog", "_generated/api/index", *GUIDE]
    absent = [page for page in pages if not (site / f"{page}.html").is_file()]
    assert not absent, absent
    reference = {page.stem: _text(page) for page in (site / "_generated" / "api").glob("*.html")}
    assert {"session", "queue", "messages", "options", "events", "exceptions", "admin", "broker", "spark",
            "compat"} <= set(reference)
    for page, text in reference.items():
        # napoleon's garbling: a namedtuple field's own docstring, a Raises entry read as a type.
        for garble in ("Alias for field number", ":raises", ":param"):
            assert garble not in text, f"{page}.html shows {garble!r}"
    # Received, never constructed: shown without the constructor's internal parameters.
    for name in ("bmq.Queue", "bmq.Message", "bmq.MessageBatch", "bmq.SessionStats"):
        assert f"class {name}(" not in reference["queue"] + reference["messages"] + reference["stats"], name
    assert "class bmq.Session(broker" in reference["session"]
    assert "SessionStats.of" not in reference["stats"]


def test_every_raises_entry_names_exceptions() -> None:
    """Each ``Raises:`` entry of a public docstring is ``Name[, Name]: why`` with one exception
    list per entry, so that napoleon renders it as a field (not ``:raises The errors of ...``)."""
    _require("sphinx")
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    config = Config(napoleon_use_ivar=True)
    wrong = []
    for qualified, _ in public_names():
        obj = None
        for candidate in sorted(_reference_modules(), key=len, reverse=True):
            if qualified.startswith(candidate + "."):
                obj = _import(candidate)
                for part in qualified[len(candidate) + 1:].split("."):
                    obj = getattr(obj, part)
                break
        doc = inspect.getdoc(obj.fget if isinstance(obj, property) else obj) or ""
        # napoleon's own Config is what it documents for this use; its annotation says sphinx's.
        text = "\n".join(GoogleDocstring(doc, config, what="function").lines())  # type: ignore[arg-type]
        for entry in re.finditer(r"^:raises (.*?):((?:.*)(?:\n(?!:).*)*)", text, flags=re.M):
            # "ArgumentTypeError (a TypeError)": the builtin it also is, said in passing.
            names, why = re.sub(r" \(an? \w+\)", "", entry.group(1)), entry.group(2)
            if not all(re.fullmatch(r"[\w.~`:]+", name.strip()) for name in re.split(r",| or ", names) if name.strip()):
                wrong.append(f"{qualified}: {names!r}")
            wrong += [f"{qualified}: {other!r} inside the entry of {names}"
                      for other in re.findall(r"\b([A-Z]\w*(?:Error|Lost|Broker)):", why)]
    assert not wrong, wrong


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
