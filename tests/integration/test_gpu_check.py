"""scripts/gpu_check.sh starts and reports before a device is ever lent: its dry run runs every
part's entry point on CPU; a part that fails or runs past its cap is recorded and the rest run;
everything it writes comes back through the device tool (at most 8 files of 16 MiB), and what a
part measured before its cap is kept."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bench.infer as bench_infer
import bench.report as bench_report
from lwm.doc_sections import write_section
from lwm.paths import REPO

ROOT = REPO


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# The device tool brings back at most 8 files from $OUT, 16 MiB each, named in letters, digits,
# '.', '_' and '-' (its README, Limits); a ninth is dropped without a word.
DEVICE_MAX_FILES, DEVICE_MAX_FILE_BYTES = 8, 16 * 2**20


def _broken_plugin(folder: Path) -> Path:
    """An installed pytest plugin that fails on import, as a device plugin built for another
    pytest would: found through its entry point whenever plugins autoload."""
    (folder / "broken_plugin.py").write_text("raise ImportError('a plugin built for another pytest')\n")
    info = folder / "broken_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\nbroken = broken_plugin\n")
    return folder


def _no_pyav(folder: Path) -> Path:
    """PyAV absent, as on the device's image (it is not among the wheels the check carries): an `av` found
    first on the path that fails to import as a missing one does."""
    (folder / "av").mkdir()
    (folder / "av" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'av'\", name='av')\n")
    return folder


def test_dry_run_runs_every_part_and_writes_the_report(tmp_path):
    """Every part, with PyAV absent as on the device: its tests part's collection imported it through the
    suite's session start (making data/sample), and the train and memory parts through lwm.core.config ->
    lwm.eval.needle -> lwm.synth.make_sample before the haystack was made only where it is read."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)  # the script must set it itself
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_broken_plugin(tmp_path)), str(_no_pyav(tmp_path)), env.get("PYTHONPATH", "")]
    )
    plans = tmp_path / "plans" / "plans.json"

    def gpu_check(*args: str) -> None:
        proc = subprocess.run(
            ["bash", "scripts/gpu_check.sh", "--dry-run", "--plans", str(plans), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr

    gpu_check("--plan-ahead")  # as before a device run: the plans made here, without a GPU
    made = json.loads(plans.read_text())
    assert len(made) == 4, list(made)  # memory: 4 configurations at 1 length; train: the first of them
    key = "debug x2 S=128 on cpu: checkpointing + offload + kept attention"
    made[key]["peak_mib"] = 4321 * 1024  # a mark: the parts show the file's plan, not one of their own
    plans.write_text(json.dumps(made))
    gpu_check("--out", str(out))
    files = {f.name: f.stat().st_size for f in out.rglob("*") if f.is_file()}
    assert len(files) <= DEVICE_MAX_FILES - 2, files  # with room to spare
    assert {"report.json", "report.md", "benchmarks.md"} <= set(files), files
    assert all(size <= DEVICE_MAX_FILE_BYTES for size in files.values()), files
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files), files
    report = json.loads((out / "report.json").read_text())
    assert [p["name"] for p in report["parts"]] == ["tests", "attention", "train", "memory", "infer", "vqgan"]
    assert all(p["status"] == "ok" for p in report["parts"]), report
    assert report["preflight"]["missing"] == [] and report["done"] and report["pending"] == []
    tests = report["parts"][0]
    # the broken plugin was not loaded, and no GPU here: every CUDA test is collected and skipped
    assert tests["env"].get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") == "1"
    assert tests["tests"]["failed"] == 0 and tests["tests"]["skipped"] >= 20
    bench = (out / "benchmarks.md").read_text()
    for section in ("train-layers-cpu", "train-features-cpu", "infer-longest-cpu"):  # written into the run's copy
        assert f"<!-- bench:{section} -->" in bench
    layers = bench.split("<!-- bench:train-layers-cpu -->")[1].split("<!-- /bench:train-layers-cpu -->")[0]
    # under each attention kernel: torch's own on a CPU, FlashAttention-3 and -4 named as not run here
    assert "| 128 | torch's CPU kernel |" in layers and "| 1.00x |" in layers
    assert "Not measured: parallel.attention_kernel=fa3: FlashAttention-3 runs on CUDA GPUs" in layers
    features = bench.split("<!-- bench:train-features-cpu -->")[1].split("<!-- /bench:train-features-cpu -->")[0]
    assert features.count("| 128 | checkpointing") == 4 and "Not measured" not in features
    assert "| 128 | checkpointing + offload + kept attention |" in features
    md = (out / "report.md").read_text()
    assert "# GPU check (dry run on CPU)" in md and "| vqgan | ok |" in md
    log = (out / "parts.log").read_text()  # every part's whole output, in one file
    assert all(f"===== {p['name']}: " in log for p in report["parts"])
    # the parts read every plan from the file made ahead, and planned none on the device
    assert log.count(": from the plans file") == 1 + 4 and "planned here" not in log
    assert report["preflight"]["plans"] == str(plans)
    row = next(line for line in features.splitlines() if line.startswith("| 128 | checkpointing + offload + kept"))
    assert "| 4321.00 |" in row, row  # the planned peak shown is the file's


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


def test_the_gpu_run_fits_its_budget():
    """The parts' caps add up to 470 s: with the preflight, 8 minutes of the device tool's 10 per call."""
    assert sum(p.cap_s for p in _module().PARTS) <= 470


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
    log = (tmp_path / "parts.log").read_text()
    assert "===== slow: " in log and "started" in log and "===== timed out" in log and "broken" in log


def test_a_part_cut_off_by_its_cap_keeps_its_rows(tmp_path, monkeypatch):
    """Rows a part prints reach parts.log and the reports while it runs (infer's 2M row may not fit)."""
    gc = _module()
    monkeypatch.setattr(gc, "PUBLISH_EVERY_S", 0.2)
    seen = []
    rows = "import time\nfor n in (1, 2, 4):\n    print(f'row {n}M', flush=True); time.sleep(0.3 if n < 4 else 60)"
    r = gc.run_part(gc.Part("rows", 2, ["-c", rows], []), False, tmp_path, dict(os.environ), progress=seen.append)
    assert r["status"] == "timed out" and "row 4M" in r["tail"]
    assert any(p["status"] == "running" and "row 1M" in p["tail"] for p in seen)
    assert "row 4M" in (tmp_path / "parts.log").read_text()


def test_a_long_output_is_trimmed_in_the_middle_and_said_so(tmp_path, monkeypatch):
    gc = _module()
    monkeypatch.setattr(gc, "LOG_HEAD_BYTES", 2000)
    monkeypatch.setattr(gc, "LOG_TAIL_BYTES", 1000)
    chatty = "for i in range(2000): print(f'line {i}')"
    r = gc.run_part(gc.Part("chatty", 30, ["-c", chatty], []), False, tmp_path, dict(os.environ))
    log = (tmp_path / "parts.log").read_text()
    assert r["status"] == "ok" and r["log_trimmed_bytes"] > 10000
    assert "line 0\n" in log and "line 1999\n" in log and "line 1000\n" not in log
    assert f"{r['log_trimmed_bytes']} bytes of output left out" in log and len(log) < 3500


def test_files_the_device_tool_would_drop_are_reported(tmp_path):
    gc = _module()
    for i in range(9):
        (tmp_path / f"f{i}.log").write_text("x")
    with open(tmp_path / "big.bin", "wb") as f:
        f.truncate(DEVICE_MAX_FILE_BYTES + 1)  # sparse: no 16 MiB written
    (tmp_path / "bad name.txt").write_text("x")
    files, problems = gc.out_problems(tmp_path)
    assert len(files) == 11 and len(problems) == 3, problems
    assert "11 files, more than 8" in problems[0] and "big.bin" in problems[1] and "bad name.txt" in problems[2]


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


def test_the_longest_prefill_keeps_the_lengths_measured_before_its_cap(tmp_path, monkeypatch):
    """bench.infer --parts longest publishes its section after each length: cut off at the third (its
    part's cap), the run's benchmarks.md holds the first two rows and names what was not measured,
    and --record copies them."""
    run, doc = tmp_path / "run.md", tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    measured = {131072: 2.0, 262144: 5.0}

    def row(model, vocab, device, length, chunk):  # no model runs: the rows as a device would give them
        if length not in measured:
            raise TimeoutError("the part's cap")
        return {"length": length, "prefill_s": measured[length], "decode_tps": 100.0, "peak_gib": 1.5}

    monkeypatch.setattr(bench_infer, "_model", lambda device, dtype: (None, None))
    monkeypatch.setattr(bench_infer, "_longest_row", row)
    monkeypatch.setattr(bench_report, "write_section", lambda name, markdown: write_section(name, markdown, run))
    with pytest.raises(TimeoutError):
        bench_infer.publish_longest("cuda", [131072, 262144, 524288], 16384, write=True)
    assert _module().record(run, doc) == 0
    section = doc.read_text().split("<!-- bench:infer-longest-cuda -->")[1]
    assert "| 131072 | 2.0 | 65536 |" in section and "| 262144 | 5.0 |" in section
    assert "Not measured (the run was still going, or stopped, when this was written): [524288]." in section
