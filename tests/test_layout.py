"""The package's layout, read from its imports: no import circle, type-only and function-level
imports included, and every import runs down docs/core.md's picture (adapters and the command,
then the transports, the selector, the twins, the core, the leaves; the emulator beside them)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Higher imports lower, never the other way. The emulator stands beside the stack: it imports
# only the leaves, and only the command imports it.
RANKS = {
    "leaves": 0,
    "core": 1,
    "twins": 2,
    "selector": 3,
    "transport": 4,
    "public names": 5,
    "rollout skeleton": 5,
    "adapters": 6,
    "command": 6,
}
EMULATOR = "emulator"


def room(module: str) -> str:
    parts = module.split(".")
    if module == "fastaccum":
        return "public names"
    top = parts[1]
    if top in ("errors", "result", "_version"):
        return "leaves"
    return {
        "_core": "core",
        "_py": "twins",
        "_cy": "twins",
        "_impl": "selector",
        "transport": "transport",
        "_rollout": "rollout skeleton",
        "slime": "adapters",
        "vime": "adapters",
        "areal": "adapters",
        "miles": "adapters",
        "ray": "transport",  # streams in Ray actors: a transport the rollout skeleton may pick
        "cli": "command",
        "__main__": "command",
        "emulator": EMULATOR,
    }[top]


def _modules() -> dict[str, tuple[Path, str]]:
    """Every module of the package with its source: fastaccum/, and the twins' folders under the
    names they are installed as (a .pyx is read for its import lines only)."""
    found: dict[str, tuple[Path, str]] = {}
    for path in sorted((ROOT / "fastaccum").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        if rel.parts[1] in ("_py", "_cy"):  # the checkout's links to the twins' folders
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        found[".".join(parts)] = (path, "py")
    for folder, package in (("python", "fastaccum._py"), ("src_cython", "fastaccum._cy")):
        for path in sorted((ROOT / folder).glob("*.py*")):
            if path.suffix not in (".py", ".pyx"):
                continue
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found.setdefault(name, (path, path.suffix[1:]))
    for pxd in (ROOT / "src_cython").glob("*.pxd"):  # one source: python/x.py compiled as _cy.x
        source = ROOT / "python" / f"{pxd.stem}.py"
        if source.exists():
            found.setdefault(f"fastaccum._cy.{pxd.stem}", (source, "py"))
    return found


PYX_IMPORT = re.compile(r"^\s*(?:from\s+(fastaccum[\w.]*)\s+c?import\s+([\w ,()]+)|import\s+(fastaccum[\w.]*))", re.M)


def _imports(path: Path, kind: str, modules: dict[str, tuple[Path, str]]) -> Iterator[str]:
    """The package's modules ``path`` imports, however and wherever it does."""
    if kind == "pyx":
        for base, names, plain in PYX_IMPORT.findall(path.read_text(encoding="utf-8")):
            if plain:
                yield plain
                continue
            subs = [f"{base}.{n.strip()}" for n in names.replace("(", "").replace(")", "").split(",") if n.strip()]
            yield from [s for s in subs if s in modules] or [base]
        return
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("fastaccum"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fastaccum"):
            subs = [f"{node.module}.{a.name}" for a in node.names]
            named = [s for s in subs if s in modules]  # "from package import submodule"
            yield from named
            if len(named) < len(subs):
                yield node.module


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, kind) in modules.items():
        for target in _imports(path, kind, modules):
            if target.startswith("fastaccum._cy.") and target not in modules:
                continue  # a C header's declarations (fa_bytes.pxd), not a module
            while target not in modules:  # "from fastaccum._core.policy import x" names a module
                target = target.rsplit(".", 1)[0]
            if target != name:
                graph[name].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_module_imports_itself_back_through_others() -> None:
    assert _circles(_graph()) == []


def test_every_import_runs_down_the_layout() -> None:
    upward = []
    for importer, targets in _graph().items():
        for target in targets:
            a, b = room(importer), room(target)
            if a == b:
                continue
            if EMULATOR in (a, b):
                ok = (a == EMULATOR and b == "leaves") or (b == EMULATOR and a == "command")
            else:
                ok = RANKS[a] > RANKS[b]
            if not ok:
                upward.append(f"{importer} ({a}) imports {target} ({b})")
    assert upward == []


def test_the_layout_has_every_room_it_draws() -> None:
    rooms = {room(name) for name in _graph()}
    assert rooms == set(RANKS) | {EMULATOR}
