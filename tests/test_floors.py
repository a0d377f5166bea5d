"""The house has floors: a package of lwm imports only packages on lower floors (and the shared
modules of floor 0), and no modules import each other in a circle. Every import is read from the
source, function-local ones included; a failure names the two modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# From the ground up (README, "The layout"); floor 0 is the shared modules lwm/<name>.py.
FLOORS = ["model", "parallel", "data", "vision", "interop", "video", "infer", "synth", "eval", "train"]
TOP = {"lwm.demo"}  # lwm-demo: a command over the model, above everything in the package


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> int:
    if module in TOP or any(module.startswith(t + ".") for t in TOP):
        return len(FLOORS) + 1
    parts = module.split(".")
    if len(parts) == 1:
        return 0  # lwm itself
    if parts[1] in FLOORS:
        return FLOORS.index(parts[1]) + 1
    return 0  # a shared module: lwm/io.py, weights.py, ...


def imports(path: Path) -> set[str]:
    """The lwm modules `path` imports (a `from lwm.x import y` names lwm.x.y when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "lwm"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "lwm":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (ROOT / Path(*sub.split("."))).with_suffix(".py").exists() or (
                    ROOT / Path(*sub.split(".")) / "__init__.py"
                ).exists()
                found.add(sub if is_module else node.module)
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted((ROOT / "lwm").rglob("*.py"))}


def test_no_import_goes_up_a_floor():
    ups = [
        f"{src} (floor {floor(src)}) imports {dst} (floor {floor(dst)})"
        for src, dsts in graph().items()
        for dst in sorted(dsts)
        if floor(dst) > floor(src)
        or (floor(dst) == floor(src) > 0 and dst.split(".")[1] != src.split(".")[1] and src not in TOP)
    ]
    assert not ups, "\n".join(ups)


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if nxt not in edges:
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
            if state.get(nxt) is None and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(edges):
        if state.get(start) is None and (cycle := visit(start, [start])):
            raise AssertionError("import cycle: " + " -> ".join(cycle))


def test_the_tools_above_are_never_imported():
    wrong = [f"{src} imports {dst}" for src, dsts in graph().items() for dst in dsts if dst.split(".")[0] != "lwm"]
    tools = [
        f"{module_name(p)} imports bench or scripts"
        for p in (ROOT / "lwm").rglob("*.py")
        if any(
            line.lstrip().startswith(("from bench", "import bench", "from scripts"))
            for line in p.read_text().splitlines()
        )
    ]
    assert not wrong and not tools, wrong + tools
