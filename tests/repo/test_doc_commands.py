"""The commands the README, docs and configs show name modules and files that exist: every
`python -m MODULE` is importable (found, not run), every `python FILE.py` is in the checkout, and
every import in the Python examples of the README and docs/ works."""

from __future__ import annotations

import importlib.util
import re
import sys

from lwm.paths import REPO

ROOT = REPO
# python -m M, torchrun ... -m M; not a placeholder such as lwm.synth.make_<name>
MODULE = r"(?:python|torchrun\b[^\n`]*?) -m ([A-Za-z_][\w.]*[A-Za-z_])(?![\w<])"
SCRIPT = r"python ([\w/]+\.py)\b"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "conf").rglob("*.yaml"))]


def commands(pattern: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for doc in DOCS:
        for name in re.findall(pattern, doc.read_text()):
            found.setdefault(name, set()).add(doc.name)
    return found


def test_python_m_modules_exist(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # bench is run from the checkout
    modules = commands(MODULE)
    assert {"lwm.eval.needle", "lwm.synth.make_sample", "bench.model"} <= set(modules)
    missing = {m: sorted(d) for m, d in modules.items() if importlib.util.find_spec(m) is None}
    assert not missing, f"python -m names modules that do not exist: {missing}"


def test_python_scripts_exist():
    scripts = commands(SCRIPT)
    assert "train.py" in scripts
    missing = {s: sorted(d) for s, d in scripts.items() if not (ROOT / s).is_file()}
    assert not missing, f"python names scripts that are not in the checkout: {missing}"


def test_a_moved_module_would_be_caught(tmp_path, monkeypatch):
    doc = tmp_path / "x.md"
    doc.write_text("python -m lwm.eval.no_such_eval --help\npython eval/needle.py\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", [doc])
    modules, scripts = commands(MODULE), commands(SCRIPT)
    assert importlib.util.find_spec("lwm.eval.no_such_eval") is None and "lwm.eval.no_such_eval" in modules
    assert not (ROOT / "eval/needle.py").is_file() and "eval/needle.py" in scripts


def test_doc_examples_import_what_exists():
    """Each import line of the ```python blocks of the README and docs/ runs (the rest of an example
    needs weights and data; the names it takes from the package must at least be there)."""
    markdown = [d for d in DOCS if d.suffix == ".md"]
    blocks = [b for d in markdown for b in re.findall(r"```python\n(.*?)```", d.read_text(), re.S)]
    lines = [line for b in blocks for line in b.splitlines() if re.match(r"(from lwm[\w.]* import |import lwm)", line)]
    assert len(lines) >= 8
    failed = {}
    for line in lines:
        try:
            exec(line, {})
        except ImportError as e:
            failed[line] = str(e)
    assert not failed, f"imports in the docs that fail: {failed}"


def test_lwm_commands_are_the_packages_scripts():
    """A command line of the docs that starts with lwm-NAME (```bash blocks and indented code) names a
    script that pip install makes ([project.scripts] in pyproject.toml)."""
    import tomllib

    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    used: dict[str, set[str]] = {}
    for doc in [d for d in DOCS if d.suffix == ".md"]:
        text = doc.read_text()
        code = (
            "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
            + "\n"
            + "\n".join(re.findall(r"(?m)^    (.*)$", text))
        )
        for name in re.findall(r"(?m)^\s*(?:torchrun\b.*?-m \S+ )?(lwm-[a-z][\w-]*)\b", code):
            used.setdefault(name, set()).add(doc.name)
    assert {"lwm-tokenize", "lwm-generate", "lwm-plan", "lwm-convert-lwm"} <= set(used)
    unknown = {n: sorted(d) for n, d in used.items() if n not in scripts}
    assert not unknown, f"commands the docs run that pip install does not make: {unknown}"
