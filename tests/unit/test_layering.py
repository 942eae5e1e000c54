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
