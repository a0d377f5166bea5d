"""The house has floors: a package of lwm imports only packages on lower floors (and the shared
modules of floor 0), and no modules import each other in a circle. Every import is read from the
source, function-local ones included; a failure names the two modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from lwm.paths import REPO

ROOT = REPO
# From the ground up (README, "The layout"); floor 0 is the shared modules lwm/<name>.py. Packages
# in one tuple share a floor: each stands on the floors below and none imports another.
FLOORS = [
    "model",
    "parallel",
    "data",
    "vision",
    "interop",
    "video",
    "infer",
    "synth",
    "eval",
    "core",
    ("train", "plan", "vqgan_training"),  # the Lightning run, the planner, the VQGAN's training
]
GROUND = ("disk",)  # packages of floor 0: what lives on disk (lwm/disk/)
TOP = {"lwm.demo"}  # lwm-demo: a command over the model, above everything in the package


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path = ROOT) -> bool:
    where = root / Path(*name.split("."))
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def floor(module: str, root: Path = ROOT) -> int:
    if module in TOP or any(module.startswith(t + ".") for t in TOP):
        return len(FLOORS) + 1
    parts = module.split(".")
    if len(parts) == 1:
        return 0  # lwm itself
    for i, packages in enumerate(FLOORS):
        if parts[1] == packages or parts[1] in packages and isinstance(packages, tuple):
            return i + 1
    if len(parts) == 2 and (root / "lwm" / f"{parts[1]}.py").exists():
        return 0  # a shared module: lwm/io.py, configs.py, ...
    if parts[1] in GROUND:
        return 0
    # A new package must be given its floor, not slip in at the bottom where anything may import it.
    raise AssertionError(
        f"{module}: lwm.{parts[1]} has no floor; add it to FLOORS here and to the README's layout, "
        f"or make it a shared module lwm/{parts[1]}.py"
    )


def absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from ... import` reads: a relative one counts up from the importer's own package."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > len(package):
        raise AssertionError(f"{module}: a relative import goes above the top package ({'.' * node.level})")
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """The lwm modules `path` imports (a `from lwm.x import y` names lwm.x.y when that is a module)."""
    module, is_package = module_name(path, root), path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "lwm"}
        elif isinstance(node, ast.ImportFrom) and (source := absolute(node, module, is_package)).split(".")[0] == "lwm":
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if is_module(sub, root) else source)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    return {module_name(p, root): imports(p, root) for p in sorted((root / "lwm").rglob("*.py"))}


def upward(edges: dict[str, set[str]], root: Path = ROOT) -> list[str]:
    """Each import that goes up a floor, or sideways into another package of the same floor."""

    def wrong(src: str, dst: str) -> bool:
        if floor(dst, root) > floor(src, root):
            return True
        same = floor(dst, root) == floor(src, root) > 0
        return same and dst.split(".")[1] != src.split(".")[1] and src not in TOP

    return [
        f"{src} (floor {floor(src, root)}) imports {dst} (floor {floor(dst, root)})"
        for src, dsts in edges.items()
        for dst in sorted(dsts)
        if wrong(src, dst)
    ]


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the modules of `edges`, as a path that ends where it starts; None if none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if nxt not in edges:
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
            if state.get(nxt) is None and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(edges):
        if state.get(start) is None and (found := visit(start, [start])):
            return found
    return None


def test_no_import_goes_up_a_floor():
    ups = upward(graph())
    assert not ups, "\n".join(ups)


def test_no_import_cycles():
    found = cycle(graph())
    assert found is None, "import cycle: " + " -> ".join(found)


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


def plant(root: Path, files: dict[str, str]) -> Path:
    """A small lwm tree under root: {"lwm/data/chat.py": source}, with the packages' __init__ files."""
    for name, source in files.items():
        path = root / name
        folder = path.parent
        while folder != root:  # every folder from lwm/ down to the file's is a package
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch()
            folder = folder.parent
        path.write_text(source)
    return root


def test_a_relative_import_up_a_floor_is_caught(tmp_path):
    root = plant(tmp_path, {"lwm/data/chat.py": "from ..train import run\n", "lwm/train/run.py": ""})
    assert upward(graph(root), root) == ["lwm.data.chat (floor 3) imports lwm.train.run (floor 11)"]


def test_packages_of_one_floor_do_not_import_each_other(tmp_path):
    root = plant(tmp_path, {"lwm/plan/fake.py": "from lwm.train import module\n", "lwm/train/module.py": ""})
    assert upward(graph(root), root) == ["lwm.plan.fake (floor 11) imports lwm.train.module (floor 11)"]


def test_the_core_runs_without_lightning():
    """lwm.core is what the Lightning run, the planner and bench/ share: none of its modules imports Lightning."""
    found = [
        f"{module_name(p)} imports {line.split()[1]}"
        for p in sorted((ROOT / "lwm" / "core").rglob("*.py"))
        for line in p.read_text().splitlines()
        if line.lstrip().startswith(("import lightning", "from lightning"))
    ]
    assert not found, found


def test_a_relative_import_cycle_is_caught(tmp_path):
    root = plant(
        tmp_path,
        {"lwm/train/run.py": "from . import loop\n", "lwm/train/loop.py": "from .run import fit\n"},
    )
    assert cycle(graph(root)) == ["lwm.train.loop", "lwm.train.run", "lwm.train.loop"]


def test_relative_imports_resolve_against_the_importers_package(tmp_path):
    root = plant(
        tmp_path,
        {
            "lwm/synth/__init__.py": "from .scene import Scene\n",
            "lwm/synth/scene.py": "",
            "lwm/synth/language.py": "from .scene import Scene\nfrom . import scene\nfrom .. import io\n",
            "lwm/io.py": "",
        },
    )
    edges = graph(root)
    assert edges["lwm.synth"] == {"lwm.synth.scene"}
    assert edges["lwm.synth.language"] == {"lwm.synth.scene", "lwm.io"}


def test_a_package_without_a_floor_is_refused():
    with pytest.raises(AssertionError, match="lwm.attic has no floor"):
        floor("lwm.attic.old")
    assert floor("lwm.io") == 0 and floor("lwm.data.chat") == FLOORS.index("data") + 1
    assert floor("lwm.plan.fake") == floor("lwm.train.run") == len(FLOORS)


# What starts a process or a process group, named in a test file: its place is tests/integration
STARTS = re.compile(
    r"subprocess|Popen|run_distributed|forked_train|run_schedule|torchrun|multiprocessing|sbatch|spawn|"
    r"init_process_group|main_in_process|train_runs import[^\n]*\btrain\b"
)


def test_unit_tests_mirror_the_package_and_start_nothing():
    """tests/unit/<package>/ for each package of lwm (tests/unit/ itself for floor 0's shared modules), and no
    unit test file names what starts a process (conftest also refuses one while it runs)."""
    unit = ROOT / "tests" / "unit"
    folders = {p.parent.relative_to(unit) for p in unit.rglob("test_*.py")}
    strays = [str(f) for f in folders if f != Path(".") and not (ROOT / "lwm" / f / "__init__.py").exists()]
    starters = [str(p.relative_to(ROOT)) for p in unit.rglob("test_*.py") if STARTS.search(p.read_text())]
    assert not strays and not starters, {"not a package of lwm": strays, "starts processes": starters}
    assert not list((ROOT / "tests").rglob("__init__.py")), "the tests' folders are not packages (one module name each)"
