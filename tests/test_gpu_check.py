"""scripts/gpu_check.sh starts and reports before a device is ever lent: its dry run runs every
part's entry point on CPU; a part that fails or runs past its cap is recorded and the rest run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_dry_run_runs_every_part_and_writes_the_report(tmp_path):
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [p["name"] for p in report["parts"]] == ["tests", "attention", "train", "infer", "vqgan"]
    assert all(p["status"] == "ok" for p in report["parts"]), report
    assert report["preflight"]["missing"] == []
    tests = report["parts"][0]["tests"]
    assert tests["failed"] == 0 and tests["skipped"] >= 20  # no GPU here: every CUDA test is collected and skipped
    bench = (tmp_path / "benchmarks.md").read_text()
    for section in ("train-layers-cpu", "infer-longest-cpu"):  # the benchmarks wrote into the run's copy
        assert f"<!-- bench:{section} -->" in bench
    assert "| 128 |" in bench.split("<!-- bench:train-layers-cpu -->")[1]
    md = (tmp_path / "report.md").read_text()
    assert "# GPU check (dry run on CPU)" in md and "| vqgan | ok |" in md


def test_without_a_gpu_the_real_run_refuses_to_start(tmp_path):
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""},
        timeout=120,
    )
    assert proc.returncode == 2 and "no CUDA device here" in proc.stderr
    assert not (tmp_path / "report.json").exists()


def test_a_failing_or_slow_part_is_recorded(tmp_path):
    gc = _module()
    env = dict(os.environ)
    slow = gc.run_part(
        gc.Part("slow", 1, ["-c", "import time; print('started', flush=True); time.sleep(60)"], []),
        False,
        tmp_path,
        env,
    )
    assert slow["status"] == "timed out" and slow["seconds"] < 10 and "started" in slow["tail"]
    bad = gc.run_part(gc.Part("bad", 30, ["-c", "raise SystemExit('broken')"], []), False, tmp_path, env)
    assert bad["status"] == "failed" and bad["rc"] == 1 and "broken" in bad["tail"]


def test_record_copies_only_the_gpu_sections(tmp_path, capsys):
    gc = _module()
    run = tmp_path / "run.md"
    run.write_text(
        "<!-- bench:infer -->\nCPU numbers\n<!-- /bench:infer -->\n"
        "<!-- bench:vqgan-cuda -->\n| 64 | 2500 |\n<!-- /bench:vqgan-cuda -->\n"
    )
    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        "# Benchmarks\n\n<!-- bench:infer -->\nkept\n<!-- /bench:infer -->\n\n"
        "<!-- bench:vqgan-cuda -->\nnot run yet\n<!-- /bench:vqgan-cuda -->\n"
    )
    assert gc.record(run, doc) == 0
    text = doc.read_text()
    assert "kept" in text and "CPU numbers" not in text and "| 64 | 2500 |" in text and "not run yet" not in text
    empty = tmp_path / "empty.md"
    empty.write_text("nothing\n")
    assert gc.record(empty, doc) == 2 and "no GPU sections" in capsys.readouterr().err
