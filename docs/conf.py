"""Sphinx configuration of bmq's documentation: the README's tour, docs/*.md, the examples and an
API reference generated from the docstrings.

Build (the ``docs`` extra): ``sphinx-build -W -b html docs docs/_build/html``; run the code
blocks: ``sphinx-build -W -b doctest docs docs/_build/doctest``. ``tests/release/test_docs_build.py``
does both and checks that every public name is in the reference.

Generated at each build (into ``docs/_generated``, not committed):

- ``api/<module>.rst`` for each public module, one entry per name in its ``__all__`` (so a new
  public name is in the reference without editing a page);
- ``tour.md``, the README with its links made to point inside the site;
- ``examples.md``, each ``examples/*.py`` with its docstring.

Code blocks: every block fenced as ``python`` in the README and in docs/*.md is run by the
doctest builder (it becomes a ``testcode`` block); fragments that cannot run alone are fenced
as ``py`` instead (still highlighted as Python).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

from sphinx.domains.python import PythonDomain

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
GENERATED = DOCS / "_generated"
sys.path.insert(0, str(ROOT))

import bmq  # noqa: E402

project = "bmq"
author = "the bmq authors"
copyright = "the bmq authors; Apache License 2.0"
release = bmq.__version__
version = release

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.doctest",
              "sphinx.ext.viewcode"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
html_theme = "alabaster"
html_title = f"bmq {release}"
html_theme_options = {"description": "A fast, dependable synchronous Python client for BlazingMQ",
                      "fixed_sidebar": True}

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_inherit_docstrings = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
doctest_global_setup = "import bmq"
# Pages written before the site: headings deeper than the toctree shows are fine.
suppress_warnings = ["myst.header"]

# The public modules, in the order of the reference (STYLE.md: bmq, bmq.events, bmq.exceptions;
# the embedded broker and the Spark data source are public packages too).
PUBLIC_MODULES = ["bmq", "bmq.events", "bmq.exceptions", "bmq.broker", "bmq.spark", "bmq.compat"]
MODULE_INTROS = {
    "bmq": "The client: sessions, queues, messages, options and the admin connection. The exceptions "
           "are importable from ``bmq`` too and are described in :doc:`bmq.exceptions`.",
    "bmq.events": "Session and queue events (``SessionOptions(on_event=...)``, ``Session.next_event``).",
    "bmq.exceptions": "Every error bmq raises derives from :class:`bmq.exceptions.Error`; each name here "
                      "is also importable from ``bmq``.",
    "bmq.broker": "The embedded broker, for tests, demos and fault injection.",
    "bmq.spark": "The ``blazingmq`` data source for PySpark (``pip install bmq[spark]``).",
    "bmq.compat": "The official ``blazingmq`` package's API on bmq: ``bmq.compat.install()`` lets code "
                  "written for it run unchanged (see :doc:`../../compat`).",
}


# Public values that are not classes nor functions carry no docstring of their own (autodoc
# would show that of their type): their description is here. A new one missing here stops the
# build with its name.
DATA_DOCS = {
    "bmq.__version__": "The installed version of bmq (also ``bmq --version``).",
    "bmq.MAX_PAYLOAD_SIZE": "The largest application data of one message, in bytes (64 MiB, as BlazingMQ's).",
    "bmq.compat.__version__": "The version of the official ``blazingmq`` API that bmq.compat mirrors.",
    "bmq.broker.DEFAULT_DOMAINS": "The domains an embedded :class:`Broker` serves unless given others: "
                                  "domain name to :class:`Domain` (``bmq.test.mem.priority``, "
                                  "``bmq.test.mem.fanout`` with appIds foo, bar and baz, "
                                  "``bmq.test.mem.broadcast``, and ``bmq.test.persistent.priority`` / "
                                  "``bmq.test.persistent.fanout``, kept in memory too).",
}


def reference_names(module_name: str) -> List[str]:
    """The names of ``module_name.__all__`` that its reference page documents (submodules have
    their own page)."""
    module = importlib.import_module(module_name)
    return [name for name in module.__all__ if not inspect.ismodule(getattr(module, name))]


def _entry(module_name: str, name: str) -> str:
    obj = getattr(importlib.import_module(module_name), name)
    if module_name == "bmq" and name in bmq.exceptions.__all__:
        # Documented once, in bmq.exceptions; here an entry so that ``bmq.X`` resolves too.
        return f".. py:exception:: {name}\n   :no-index-entry:\n\n   The same class as :exc:`bmq.exceptions.{name}`."
    if module_name == "bmq.compat" and getattr(bmq, name, None) is obj:
        # bmq's own classes that bmq.compat re-exports (its enums): documented once, in bmq.
        return f".. py:class:: {name}\n   :no-index-entry:\n\n   The same class as :class:`bmq.{name}`."
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return f".. autoexception:: {name}\n   :members:\n   :show-inheritance:"
    if inspect.isclass(obj):
        options = ["   :members:"]
        if issubclass(obj, __import__("enum").Enum):
            options.append("   :undoc-members:")
        return "\n".join([f".. autoclass:: {name}", *options])
    if callable(obj):
        return f".. autofunction:: {name}"
    qualified = f"{module_name}.{name}"
    if qualified not in DATA_DOCS:
        raise RuntimeError(f"docs/conf.py: the public value {qualified} has no description in DATA_DOCS")
    value = f"   :value: {obj!r}\n" if isinstance(obj, (int, str)) else ""
    return f".. py:data:: {name}\n   :type: {type(obj).__name__}\n{value}\n   {DATA_DOCS[qualified]}"


def write_api_pages() -> None:
    api = GENERATED / "api"
    api.mkdir(parents=True, exist_ok=True)
    for module_name in PUBLIC_MODULES:
        title = f"``{module_name}``"
        lines = [title, "=" * len(title), "", f".. automodule:: {module_name}", "   :no-members:", "",
                 MODULE_INTROS[module_name], "", f".. currentmodule:: {module_name}", ""]
        for name in reference_names(module_name):
            lines += [_entry(module_name, name), ""]
        _write(api / f"{module_name}.rst", "\n".join(lines))


def _site_links(text: str, prefix: str) -> str:
    """README links to ``docs/x.md`` and to the changelog point at the site's pages."""
    text = re.sub(r"\]\(docs/([a-z_]+)\.md\)", rf"]({prefix}\1.md)", text)
    return text.replace("](CHANGELOG.md)", f"]({prefix}changelog.md)")


def write_tour() -> None:
    readme = (ROOT / "README.md").read_text()
    _write(GENERATED / "tour.md", _site_links(readme, "../"))


def write_examples() -> None:
    lines = ["# Examples", "",
             "Each example has a `main()` that the test suite runs against the embedded broker "
             "(`tests/integration/test_examples.py`); run one with `python examples/NAME.py`.", ""]
    for path in sorted((ROOT / "examples").glob("*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        lines += [f"## `examples/{path.name}`", "", docstring, "",
                  f"```{{literalinclude}} ../../examples/{path.name}", ":language: python", "```", ""]
    _write(GENERATED / "examples.md", "\n".join(lines))


def _write(path: Path, text: str) -> None:
    """Write only on change, so an unchanged page is not rebuilt."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


_PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", flags=re.M | re.S)
# Each runnable block prints what it did (as tests/integration/test_readme.py requires of the
# README's): the doctest builder checks that it ran without an error, not the exact figures.
_RUN_BLOCK = "```{testcode}\n\\1```\n\n```{testoutput}\n:hide:\n:options: +ELLIPSIS\n\n...\n```"


def run_python_blocks(app: Any, docname: str, source: List[str]) -> None:
    """Every ``python`` block of a Markdown page is a doctest ``testcode`` block (one namespace per
    page, as the doctest builder groups them)."""
    if str(app.env.doc2path(docname)).endswith(".md"):
        source[0] = _PYTHON_BLOCK.sub(_RUN_BLOCK, source[0])


write_api_pages()
write_tour()
write_examples()


class _PythonDomain(PythonDomain):
    """An exception named without its module (napoleon's ``Raises:``) is bmq's exception:
    ``ConnectionLost`` and ``Error`` are also event names, and ``bmq.X`` re-exports
    ``bmq.exceptions.X``."""

    def find_obj(self, env: Any, modname: str, classname: str, name: str, type: Any,
                 searchmode: int = 0) -> List[Tuple[str, Any]]:
        matches = super().find_obj(env, modname, classname, name, type, searchmode)
        if len(matches) > 1 and type == "exc":
            exceptions = [match for match in matches if match[0].startswith("bmq.exceptions.")]
            if len(exceptions) == 1:
                return exceptions
        if len(matches) > 1:
            # An unqualified name (``Ack`` in a docstring) is the public one of the page's own
            # module, else bmq's own rather than bmq.compat's namesake.
            public = [m for m in matches if not any(part.startswith("_") for part in m[0].split("."))]
            for preferred in ([m for m in public if modname and m[0].rsplit(".", 1)[0] == modname],
                              [m for m in public if not m[0].startswith("bmq.compat.")]):
                if len(preferred) == 1:
                    return preferred
        return matches


def setup(app: Any) -> Dict[str, Any]:
    app.add_domain(_PythonDomain, override=True)
    app.connect("source-read", run_python_blocks)
    return {"parallel_read_safe": True}
