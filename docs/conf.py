"""Sphinx configuration of bmq's documentation: the user guide (docs/*.md), the examples and an
API reference generated from the docstrings, a page per class or group.

Build (the ``docs`` extra, no Spark needed): ``pip install ".[docs]"``, then
``sphinx-build -W -b html docs docs/_build/html``; run the code blocks:
``sphinx-build -W -b doctest docs docs/_build/doctest``. ``tests/release/test_docs_build.py``
does both (the HTML build as on a machine without pyspark) and checks that every public name is
in the reference.

Generated at each build (into ``docs/_generated``, not committed):

- ``api/<page>.rst``, one page per entry of ``REFERENCE_PAGES``; a public name of ``bmq`` that no
  page lists is documented on the reference's index page (so a new public name is in the
  reference without editing this file, until it is given its place);
- ``tour.md``, the README with its links made to point inside the site;
- ``examples.md``, each ``examples/*.py`` with its docstring.

Code blocks: every block fenced as ``python`` in the README and in docs/*.md is run by the
doctest builder (it becomes a ``testcode`` block); fragments that cannot run alone are fenced
as ``py`` instead (still highlighted as Python).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from sphinx.domains.python import PythonDomain

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
GENERATED = DOCS / "_generated"
if any(path.suffix in (".so", ".pyd") for path in (ROOT / "bmq").glob("_codec.*")):
    # Built in place (pip install -e .): document this tree.
    sys.path.insert(0, str(ROOT))
else:
    # An unbuilt clone (pip install ".[docs]" installed bmq elsewhere): it must not shadow the
    # installed package (``python -m sphinx`` puts the working directory first).
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != ROOT]

from sphinx.ext.autodoc.mock import mock  # noqa: E402
from sphinx.ext.napoleon.docstring import GoogleDocstring  # noqa: E402

import bmq  # noqa: E402


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


# bmq.spark imports pyspark, pyarrow and pandas (the spark extra): the reference is built without
# them, on mocks, so that the docs extra alone builds the site.
autodoc_mock_imports = [name for name in ("pyspark", "pyarrow", "pandas") if not _importable(name)]

project = "bmq"
author = "the bmq authors"
copyright = "the bmq authors; Apache License 2.0"
release = bmq.__version__
version = release

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon",
              "sphinx.ext.doctest", "sphinx.ext.viewcode"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
# furo: a page's own table of contents (sections, and on reference pages every class and member)
# beside the text, a readable line length, search, and a layout that works on a phone.
html_theme = "furo"
html_title = f"bmq {release}"
html_short_title = "bmq"
html_static_path = ["_static"]
html_css_files = ["bmq.css"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_inherit_docstrings = True
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
doctest_global_setup = "import bmq"
# Pages written before the site: headings deeper than the toctree shows are fine.
suppress_warnings = ["myst.header"]

# The public modules (STYLE.md: bmq, bmq.events, bmq.exceptions; the embedded broker, the Spark
# data source and the official SDK's API are public packages too).
PUBLIC_MODULES = ["bmq", "bmq.events", "bmq.exceptions", "bmq.broker", "bmq.spark", "bmq.compat"]

# The reference, a page per class or group: (page, title, module, names or None for all of the
# module's __all__, introduction).
REFERENCE_PAGES: List[Tuple[str, str, str, Optional[List[str]], str]] = [
    ("session", "Session", "bmq", ["Session", "SessionState"],
     "A session is one connection to a broker (reconnected as needed), with the threads that serve "
     "it. See :doc:`../../getting-started` and :doc:`../../threads`."),
    ("queue", "Queue", "bmq", ["Queue", "QueueState", "QueueUri", "parse_uri"],
     "A queue is opened by :meth:`Session.open_queue`, never constructed. See "
     ":doc:`../../producing` and :doc:`../../consuming`."),
    ("messages", "Messages and acknowledgements", "bmq",
     ["Message", "MessageBatch", "Ack", "AckStatus", "PropertyType", "CompressionAlgorithmType",
      "deterministic_guid", "MAX_PAYLOAD_SIZE"],
     "What a consumer receives (:class:`Message`, :class:`MessageBatch`) and what a producer gets back "
     "(:class:`Ack`); none of them is constructed by an application."),
    ("options", "Options", "bmq",
     ["SessionOptions", "QueueOptions", "Subscription", "ReconnectPolicy", "tls_context",
      "HostHealthMonitor", "ManualHostHealthMonitor"],
     "Options are keyword-only frozen dataclasses: build a changed copy with "
     ":func:`dataclasses.replace`."),
    ("stats", "Statistics", "bmq", ["SessionStats", "QueueStats"],
     "Snapshots returned by :meth:`Session.stats` and :meth:`Queue.stats`. See :doc:`../../observability`."),
    ("admin", "Admin", "bmq",
     ["Admin", "BrokerQueueStats", "AppStats", "PurgeResult", "DomainInfo", "ClusterInfo", "ClusterStatus",
      "ClusterNode", "PartitionStatus"],
     "The broker's admin commands, and the values its typed helpers return."),
    ("events", "Events", "bmq.events", None,
     "Session and queue events, given to ``SessionOptions(on_event=...)`` or returned by "
     ":meth:`bmq.Session.next_event`. See :doc:`../../high-availability`."),
    ("exceptions", "Exceptions", "bmq.exceptions", None,
     "Every error bmq raises derives from :class:`bmq.exceptions.Error`; each name here is also "
     "importable from ``bmq`` (``bmq.TimeoutError`` is ``bmq.exceptions.TimeoutError``)."),
    ("broker", "Embedded broker", "bmq.broker", None,
     "The embedded broker, for tests, demos and fault injection."),
    ("spark", "Spark data source", "bmq.spark", None,
     "The ``blazingmq`` data source for PySpark (``pip install 'bmq[spark]'``); see :doc:`../../spark`."),
    ("compat", "bmq.compat", "bmq.compat", None,
     "The official ``blazingmq`` package's API on bmq: ``bmq.compat.install()`` lets code written for it "
     "run unchanged; see :doc:`../../compat`."),
]

# Classes an application receives but never constructs: shown without their constructor's
# (internal) parameters.
RECEIVED_CLASSES = {
    "bmq.Queue", "bmq.Message", "bmq.MessageBatch", "bmq.Ack", "bmq.QueueUri", "bmq.SessionStats",
    "bmq.QueueStats", "bmq.AppStats", "bmq.BrokerQueueStats", "bmq.ClusterInfo", "bmq.ClusterNode",
    "bmq.ClusterStatus", "bmq.DomainInfo", "bmq.PartitionStatus", "bmq.PurgeResult",
    "bmq.broker.ClientSession", "bmq.broker.Faults", "bmq.broker.StoredMessage",
    "bmq.compat.Ack", "bmq.compat.Message", "bmq.compat.MessageHandle",
    # Spark constructs it (the application registers the class).
    "bmq.spark.BlazingMQDataSource",
}
# Public by Python's rules, internal by use (qualified names): not in the reference.
INTERNAL_MEMBERS = {"SessionStats.of"}

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


def _module(module_name: str) -> Any:
    with mock(autodoc_mock_imports):
        return importlib.import_module(module_name)


def reference_names(module_name: str) -> List[str]:
    """The names of ``module_name.__all__`` that the reference documents (submodules have their
    own pages)."""
    module = _module(module_name)
    return [name for name in module.__all__ if not inspect.ismodule(getattr(module, name))]


# A method the session's units call on a queue says so in its docstring's first words: not
# public API, so not in the reference (its name has no underscore so that the layering test
# sees no module reaching into another's private attributes).
_SESSION_SIDE = "Session side (not public API)"


def _internal(qualname: str, value: Any) -> bool:
    return qualname in INTERNAL_MEMBERS or (getattr(value, "__doc__", None) or "").startswith(_SESSION_SIDE)


def _public_members(obj: type) -> List[str]:
    """A class's own public methods and properties, in source order (the reference's summary)."""
    return [member for member, value in vars(obj).items()
            if not member.startswith("_") and not _internal(f"{obj.__qualname__}.{member}", value)
            and (inspect.isfunction(value) or isinstance(value, (property, classmethod, staticmethod)))]


def _entry(module_name: str, name: str) -> str:
    obj = getattr(_module(module_name), name)
    if module_name == "bmq.compat" and getattr(bmq, name, None) is obj:
        # bmq's own classes that bmq.compat re-exports (its enums): documented once, in bmq.
        return f".. py:class:: {name}\n   :no-index-entry:\n\n   The same class as :class:`bmq.{name}`."
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return f".. autoexception:: {name}\n   :members:\n   :show-inheritance:"
    if inspect.isclass(obj):
        options = ["   :members:"]
        if issubclass(obj, __import__("enum").Enum):
            options.append("   :undoc-members:")
        members = _public_members(obj)
        summary = []
        if len(members) > 3:
            summary = ["   .. rubric:: Members", "", "   .. autosummary::", "      :nosignatures:", "",
                       *[f"      ~{name}.{member}" for member in members], ""]
        return "\n".join([f".. autoclass:: {name}", *options, "", *summary])
    if callable(obj):
        return f".. autofunction:: {name}"
    qualified = f"{module_name}.{name}"
    if qualified not in DATA_DOCS:
        raise RuntimeError(f"docs/conf.py: the public value {qualified} has no description in DATA_DOCS")
    value = f"   :value: {obj!r}\n" if isinstance(obj, (int, str)) else ""
    return f".. py:data:: {name}\n   :type: {type(obj).__name__}\n{value}\n   {DATA_DOCS[qualified]}"


def _title(text: str, underline: str) -> List[str]:
    return [text, underline * len(text), ""]


def _summary(names: List[str]) -> List[str]:
    return [".. autosummary::", "   :nosignatures:", "", *[f"   {name}" for name in names], ""]


def write_api_pages() -> None:
    api = GENERATED / "api"
    placed: Set[str] = set()
    for page, title, module_name, names, intro in REFERENCE_PAGES:
        names = names if names is not None else reference_names(module_name)
        placed.update(f"{module_name}.{name}" for name in names)
        lines = [*_title(title, "="), f".. currentmodule:: {module_name}", ""]
        if names is None or page in ("events", "exceptions", "broker", "spark", "compat"):
            lines += [f".. automodule:: {module_name}", "   :no-members:", ""]
        module = _module(module_name)
        lines += [intro, "", *_summary([name for name in names if callable(getattr(module, name))])]
        for name in names:
            lines += [_entry(module_name, name), ""]
        _write(api / f"{page}.rst", "\n".join(lines))
    # The reference's index: the pages, then what of bmq no page lists (bmq.__version__, a new name).
    exceptions = set(bmq.exceptions.__all__)
    rest = [name for name in reference_names("bmq") if f"bmq.{name}" not in placed and name not in exceptions]
    lines = [*_title("API reference", "="), ".. automodule:: bmq", "   :no-members:", "",
             ".. toctree::", "   :maxdepth: 1", "", *[f"   {page[0]}" for page in REFERENCE_PAGES], "",
             *_title("Also in ``bmq``", "-"), ".. currentmodule:: bmq", ""]
    lines += [_entry("bmq", name) + "\n" for name in rest]
    # bmq re-exports bmq.exceptions: an entry for each, so that ``bmq.X`` resolves too.
    lines += [*_title("Exceptions, importable from ``bmq`` too", "-"),
              "Each is the class of the same name in :doc:`exceptions`: ``bmq.TimeoutError`` is "
              ":exc:`bmq.exceptions.TimeoutError`.", ""]
    lines += [f".. py:exception:: {name}\n   :no-index-entry:\n   :no-contents-entry:\n\n"
              f"   The same class as :exc:`bmq.exceptions.{name}`.\n" for name in bmq.exceptions.__all__]
    _write(api / "index.rst", "\n".join(lines))
    for stale in set(api.glob("*.rst")) - {api / f"{page[0]}.rst" for page in REFERENCE_PAGES} - {api / "index.rst"}:
        stale.unlink()


def _site_links(text: str, prefix: str) -> str:
    """README links to ``docs/x.md`` (and pictures ``docs/x.png``) and to the changelog point at
    the site's pages."""
    text = re.sub(r"\]\(docs/([a-z0-9_-]+)\.(md|png)\)", rf"]({prefix}\1.\2)", text)
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


def skip_member(app: Any, what: str, name: str, obj: Any, skip: bool, options: Any) -> Optional[bool]:
    """Leave out a namedtuple's fields (the class's ``Attributes`` section describes them; their
    own docstring is ``Alias for field number N``) and the internal members."""
    doc = getattr(obj, "__doc__", None) or ""
    if doc.startswith("Alias for field number "):
        return True
    if _internal(getattr(obj, "__qualname__", ""), obj):
        return True
    return None


def hide_constructor(app: Any, what: str, name: str, obj: Any, options: Any, signature: Optional[str],
                     return_annotation: Optional[str]) -> Optional[Tuple[str, Optional[str]]]:
    """A class the application receives (an event, an enum...) is shown without constructor
    parameters."""
    if what in ("class", "exception") and inspect.isclass(obj) and (
            name in RECEIVED_CLASSES or obj.__module__ == "bmq.events" or issubclass(obj, __import__("enum").Enum)):
        return "", None
    return None


def _attribute_docstring(self: GoogleDocstring) -> List[str]:
    """Napoleon reads an attribute's or property's first line ``X: text`` as type X and text (so
    "The broker address in use (tcp://HOST:PORT): ..." became a type); bmq's annotations give the
    type, so the docstring is taken as written."""
    return type(self)(list(self._consume_to_end()), self._config).lines()


GoogleDocstring._parse_attribute_docstring = _attribute_docstring  # type: ignore[method-assign]


def setup(app: Any) -> Dict[str, Any]:
    app.add_domain(_PythonDomain, override=True)
    app.connect("autodoc-skip-member", skip_member)
    app.connect("autodoc-process-signature", hide_constructor)
    app.connect("source-read", run_python_blocks)
    return {"parallel_read_safe": True}
