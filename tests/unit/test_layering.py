"""The layering of docs/architecture.md, locked: which modules may import which (at run time;
imports under ``if TYPE_CHECKING:`` are for annotations and do not count)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Set

ROOT = Path(__file__).resolve().parents[2]

# Client layers, lowest first; a module may import its own layer and the ones below.
LAYERS = [
    {"_codec", "_protocol", "_version", "exceptions", "_expression", "_types", "_uri", "events", "_health", "_dispatch", "_stats"},
    {"_ctrlmsg", "_ber", "_schema", "_properties", "_outbox", "_tls", "_options"},
    {"_transport"},
    {"_connection", "_requests", "_registry", "_handles", "_deliveries", "_telemetry", "_state", "_recovery", "_puts", "_queue",
     "_session", "_admin"},
    {"__init__"},
]
# The embedded broker shares the codec and the schema, never the client's session machinery.
BROKER_MAY_IMPORT = LAYERS[0] | LAYERS[1]
# Applications of the public API.
APPLICATIONS = {"cli", "_bench", "__main__"}
PUBLIC = {"bmq", "bmq.broker"}
# bmq.compat (the official SDK's API on bmq) is an application too: bmq's public modules only.
COMPAT_MAY_IMPORT = {"bmq", "bmq.events", "bmq.exceptions"}


def _runtime_imports(path: Path, package: str) -> Set[str]:
    tree = ast.parse(path.read_text())
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                found.update(f"{target}.{a.name}" for a in node.names) if node.module is None else found.add(target)
            elif node.module and node.module.split(".")[0] == "bmq":
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "bmq")
    return found


def _imports() -> Dict[str, Set[str]]:
    result = {}
    for path in (ROOT / "bmq").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        package = ".".join(parts[:-1])
        result[".".join(parts)] = _runtime_imports(path, package)
    return result


def _rank(module: str) -> int:
    name = module.split(".")[1] if module.count(".") else "__init__"
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


def test_client_modules_import_only_their_layer_and_below():
    wrong = []
    for module, deps in _imports().items():
        parts = module.split(".")
        if len(parts) != 2 or parts[1] in APPLICATIONS:
            continue
        for dep in deps:
            dparts = dep.split(".")
            if dep == "bmq" or (len(dparts) > 1 and dparts[1] in ("broker", "spark", "cli", "_bench")):
                wrong.append((module, dep))
            elif len(dparts) > 1 and _rank(dep) > _rank(module.replace(".__init__", "")):
                wrong.append((module, dep))
    assert not wrong, wrong


def test_broker_never_imports_the_client_session_machinery():
    wrong = [(module, dep) for module, deps in _imports().items() if module.startswith("bmq.broker.")
             for dep in deps if not dep.startswith("bmq.broker") and dep.split(".")[1] not in BROKER_MAY_IMPORT]
    assert not wrong, wrong


def test_cli_and_spark_use_only_the_public_api():
    wrong = []
    for module, deps in _imports().items():
        parts = module.split(".")
        if parts[1] == "spark" or parts[1] in APPLICATIONS:
            own = "bmq.spark" if parts[1] == "spark" else "bmq._bench"
            wrong += [(module, dep) for dep in deps if dep not in PUBLIC and not dep.startswith(own)
                      and dep not in ("bmq.cli", "bmq.MAX_PAYLOAD_SIZE")]
    assert not wrong, wrong


def test_compat_uses_only_the_public_api():
    wrong = [(module, dep) for module, deps in _imports().items() if module.startswith("bmq.compat.")
             for dep in deps if dep not in COMPAT_MAY_IMPORT and not dep.startswith("bmq.compat")]
    assert not wrong, wrong


# ---- private attributes stay in their module -------------------------------------------------
# A module reads or writes ``obj._name`` only for names it defines itself (``self._name = ...``,
# ``def _name``, a class or module-level ``_name``, ``__slots__``). The session's units talk to
# each other through named methods: Recovery to ConnectionState, Queue to QueueServices, the
# units to Queue's session-side methods.
# Checked: the client's session layer and the transport, where the state lives.
PRIVATE_CHECKED = LAYERS[2] | LAYERS[3]
# (module, attribute): why it stays. Keep this short.
PRIVATE_ALLOWED = {
    # MessageBatch (bmq/_types.py) hands the queue's get_batch its limits and its split; the
    # batch is Queue's own inbox item, and _types.py sits below the session layer.
    ("_queue", "_count_within"),
    ("_queue", "_split"),
    # A Message or MessageBatch (bmq/_types.py, public values) keeps its Queue, and its span,
    # out of its public API; confirming it and tracing it need them.
    ("_deliveries", "_queue"),
    ("_telemetry", "_queue"),
    ("_telemetry", "_trace"),
    # threading.RLock's own owner query (threading.Condition relies on it): whether the thread
    # an interrupt stopped holds the take lock (Queue._take).
    ("_queue", "_is_owned"),
}


# A NamedTuple's public methods start with "_" so as not to clash with its fields.
_NAMEDTUPLE_API = {"_replace", "_asdict", "_make", "_fields", "_field_defaults"}


def _defined_privates(tree: ast.AST) -> Set[str]:
    """The private names a module defines: its functions and classes, its module-level names,
    the attributes it assigns on ``self``/``cls``, the names in its ``__slots__``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                  for t in node.targets):
            names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return {name for name in names if isinstance(name, str) and name.startswith("_")}


def _foreign_private_accesses(path: Path) -> Set[str]:
    tree = ast.parse(path.read_text())
    own = _defined_privates(tree)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")) or name in _NAMEDTUPLE_API:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            if name in own or not isinstance(node.ctx, ast.Load):
                continue
        elif name in own and isinstance(node.ctx, ast.Load):
            continue
        found.add(name)
    return found


def test_session_modules_read_no_other_modules_private_attributes():
    wrong = []
    for name in sorted(PRIVATE_CHECKED):
        path = ROOT / "bmq" / f"{name}.py"
        for attr in sorted(_foreign_private_accesses(path) if path.exists() else ()):
            if (name, attr) not in PRIVATE_ALLOWED:
                wrong.append(f"bmq/{name}.py: ._{attr.lstrip('_')}")
    assert not wrong, "private attributes of another module: " + ", ".join(wrong)


def test_the_private_attribute_check_sees_reads_and_writes_through_other_objects(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class A:\n    def __init__(self, other):\n        self._mine = 1\n"
                      "        other._theirs = 2\n        print(other._read, self._mine, other._mine)\n")
    assert _foreign_private_accesses(module) == {"_theirs", "_read"}
