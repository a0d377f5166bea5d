"""The scripts under data/ (not a package), loaded by path for the tests, and their JSON-lines output."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def load_script(name: str):
    """data/<name>.py as a module (loading it also puts data/ on sys.path, for sample_lib)."""
    spec = importlib.util.spec_from_file_location(name, DATA / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
