"""pyproject.toml declares exactly what the code imports, so that a fresh virtual environment
(what .ci/run builds) has every package the code needs, and a declaration nobody needs is noticed:
removing any declared dependency fails this test."""

from __future__ import annotations

import ast
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from lwm.paths import REPO

ROOT = REPO
CODE = ["lwm", "bench", "train.py", "train_vqgan.py"]
# Needed at run time but imported by a library, not by our code; each with the reason.
INDIRECT = {
    "tensorboard": "Lightning's TensorBoardLogger (every training run, lwm/train/run.py) writes through it",
    "protobuf": "transformers reads a sentencepiece model through it (AutoTokenizer on an exported folder)",
}
INDIRECT_DEV = {"ruff": "tests/repo/test_style.py runs it as a program (python -m ruff)"}
# Installed by the README's test command without its requirements (pip install --no-deps): its full list pins
# antlr4-python3-runtime 4.7.2, which Hydra cannot use. What it imports when it runs lwm is the lmms extra.
NO_DEPS = {
    "lmms-eval": {
        "lwm/eval/lmms.py",
        "lwm/eval/lmms_run.py",
        "tests/integration/test_lmms.py",
        "tests/integration/test_lmms_exit.py",
    }
}
# Import names of packages that may be absent here (a platform marker), by distribution.
KNOWN = {"decord": "decord"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> tuple[set[str], set[str]]:
    """(dependencies, the dev extra); the dev extra's lwm[lmms] stands for the lmms extra's packages, which
    lmms-eval imports (NO_DEPS), so no test need import them."""
    core, dev, _ = declared_with_lmms()
    return core, dev


def declared_with_lmms() -> tuple[set[str], set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = lambda reqs: {norm(re.match(r"[A-Za-z0-9_.-]+", r).group()) for r in reqs}  # noqa: E731
    extras = project["optional-dependencies"]
    lmms = names(extras["lmms"])
    dev = names(r for r in extras["dev"] if not r.startswith("lwm["))
    assert "lwm[lmms]" in extras["dev"], (
        "the dev extra installs the lmms extra (the suite runs tests/integration/test_lmms.py)"
    )
    return names(project["dependencies"]), dev, lmms


def imports(paths: list[Path]) -> dict[str, set[str]]:
    """top-level module name -> files importing it (absolute imports, function-local ones included)."""
    found: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def python_files(entries: list[str]) -> list[Path]:
    files: list[Path] = []
    for entry in entries:
        p = ROOT / entry
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return files


def local_names() -> set[str]:
    """Our own modules: top-level folders and files, and the test helpers (pytest puts tests/ on sys.path)."""
    names = {p.stem for p in ROOT.iterdir() if p.suffix == ".py" or (p.is_dir() and not p.name.startswith("."))}
    for folder in ("tests",):
        names |= {p.stem for p in (ROOT / folder).glob("*.py")} | {
            p.name for p in (ROOT / folder).iterdir() if p.is_dir()
        }
    return names


def distributions(found: dict[str, set[str]]) -> dict[str, set[str]]:
    """distribution -> files importing it; raises for a third-party module no distribution provides."""
    owners = md.packages_distributions()
    out: dict[str, set[str]] = {}
    skip = set(sys.stdlib_module_names) | local_names() | {"__future__"}
    for module, files in found.items():
        if module in skip:
            continue
        dists = owners.get(module) or ([KNOWN[module]] if module in KNOWN else None)
        assert dists, f"{sorted(files)} import {module!r}, which no installed distribution provides"
        out.setdefault(norm(dists[0]), set()).update(files)
    return out


def test_the_code_imports_only_declared_packages_and_every_declared_one_is_needed():
    core, dev = declared()
    used = distributions(imports(python_files(CODE)))
    undeclared = {d: sorted(f)[:3] for d, f in used.items() if d not in core and not f <= NO_DEPS.get(d, set())}
    assert not undeclared, f"imported but not in [project] dependencies: {undeclared}"
    unneeded = core - set(used) - set(INDIRECT)
    assert not unneeded, f"declared but imported nowhere (and not in INDIRECT with a reason): {sorted(unneeded)}"
    assert set(INDIRECT) <= core, f"INDIRECT names packages that are not declared: {sorted(set(INDIRECT) - core)}"


def test_the_tests_import_only_declared_packages_and_every_dev_one_is_needed():
    core, dev = declared()
    used = distributions(imports(python_files(["tests"])))
    undeclared = {d: sorted(f)[:3] for d, f in used.items() if d not in core | dev and not f <= NO_DEPS.get(d, set())}
    assert not undeclared, f"tests import packages in neither dependencies nor the dev extra: {undeclared}"
    unneeded = dev - set(used) - set(INDIRECT_DEV)
    assert not unneeded, f"dev extra declares packages no test imports: {sorted(unneeded)}"


def quick_start_commands() -> list[str]:
    """The bash blocks of the README's Quick start section, in order."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## Quick start' section"
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section.group(1), re.S)]


def test_ci_runs_the_readmes_commands():
    """.ci/run runs the README's test command verbatim, in a venv of its own; both commands install first."""
    got = quick_start_commands()
    assert got == [
        "pip install -e . && python train.py",
        'pip install -e ".[dev]" && pip install --no-deps lmms-eval==0.7.3 && python -m pytest -q -n 3',
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert got[1] in ci.splitlines() and "-m venv" in ci and "system-site-packages" not in ci


@pytest.mark.parametrize("tests_pass", [True, False])
def test_ci_removes_the_venv_it_made_and_stops_the_cluster_it_started(tmp_path, tests_pass):
    """.ci/run with python3, pip, python and the SLURM script replaced by stubs that log their calls: the venv
    made under TMPDIR and the cluster it started are gone at the end, whether the tests pass or not (left, each
    run's 7 GB venv stayed in /tmp until the disk was full)."""
    repo, bin_dir, tmp, log = tmp_path / "repo", tmp_path / "bin", tmp_path / "tmp", tmp_path / "calls.log"
    for d in (repo / ".ci", repo / "scripts" / "slurm", bin_dir, tmp):
        d.mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    (repo / "scripts" / "slurm" / "local-cluster.sh").write_text(
        f'echo "cluster $1" >> {log}\n[ "$1" != status ]\n'  # not running; start and stop succeed
    )
    code = 0 if tests_pass else 1
    stubs = {  # python3 -m venv --clear DIR makes DIR/bin/activate, which puts these stubs first
        "python3": f'echo "python3 $*" >> {log}; mkdir -p "$4/bin"; echo "PATH={bin_dir}:$PATH" > "$4/bin/activate"',
        "pip": f'echo "pip $*" >> {log}',
        "python": f'echo "python $*" >> {log}; exit {code}',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp)}
    env.pop("LWM_CI_VENV", None)
    done = subprocess.run(["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True)
    calls = log.read_text().splitlines()
    assert done.returncode == code, done.stderr
    assert calls[0] == "cluster status" and calls[1] == "cluster start" and calls[-1] == "cluster stop", calls
    venv = next(c for c in calls if c.startswith("python3 -m venv")).split()[-1]
    assert venv.startswith(str(tmp)) and "python -m pytest -q -n 3" in calls
    assert not any(tmp.iterdir()), list(tmp.iterdir())  # the venv's folder is gone
