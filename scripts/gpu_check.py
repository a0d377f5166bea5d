"""The GPU check: every CUDA path's tests and the GPU halves of the benchmarks, one call.

Each part is its own process with its own time cap; a part that fails or runs out of time is
recorded and the next one runs. Everything lands in the output folder:

    report.json      per part: command, cap, seconds, exit status, test counts, output tail
    report.md        the same as a summary table, then each part's output
    <part>.log       each part's whole output
    benchmarks.md    docs/benchmarks.md with the benchmarks' GPU sections filled in

    scripts/gpu_check.sh                       # on a machine with a GPU (see that file's header)
    scripts/gpu_check.sh --dry-run --out DIR   # the same plumbing on CPU, tiny shapes, seconds
    python scripts/gpu_check.py --record DIR/benchmarks.md   # copy a run's GPU sections into docs/
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
PY = sys.executable
# What the check imports, by import name; a missing one is reported before anything runs.
MODULES = ("torch", "lightning", "hydra", "omegaconf", "transformers", "sentencepiece", "safetensors", "pytest")
TAIL_LINES = 60


@dataclass
class Part:
    name: str
    cap_s: int  # the GPU run's caps add up to 8 minutes with the preflight
    gpu: list[str]  # arguments after the interpreter
    dry: list[str]  # the same entry point on CPU with tiny shapes

    def command(self, dry: bool, out: Path) -> list[str]:
        args = self.dry if dry else self.gpu
        return [PY, *(a.replace("{out}", str(out)) for a in args)]


TESTS = [
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:cacheprovider",
    "tests/test_gpu.py",
    "tests/test_parallel_gpu.py",
    "--junitxml",
    "{out}/tests.xml",
]
PARTS = [
    # ring / Ulysses / hybrid and document masks on CUDA, a one-GPU bf16 training step, the KV cache
    Part("tests", 110, TESTS, TESTS),
    # the ring schedule over simulated ranks vs one fused SDPA flash call, bf16, fwd+bwd
    Part(
        "attention",
        100,
        [
            "-m",
            "bench.attention",
            "--parts",
            "decomposition",
            "--device",
            "cuda",
            "--dtype",
            "bf16",
            "--lengths",
            "32768",
            "131072",
            "--heads",
            "32",
            "--dim",
            "128",
            "--repeats",
            "3",
        ],
        [
            "-m",
            "bench.attention",
            "--parts",
            "decomposition",
            "--device",
            "cpu",
            "--dtype",
            "bf16",
            "--lengths",
            "256",
            "--heads",
            "2",
            "--dim",
            "64",
            "--repeats",
            "1",
        ],
    ),
    # a few layers of the 7b preset: FSDP2 bf16, activation checkpointing, 8K and 32K tokens
    Part(
        "train",
        100,
        [
            "-m",
            "bench.train",
            "--part",
            "layers",
            "--device",
            "cuda",
            "--preset",
            "7b",
            "--layers",
            "4",
            "--lengths",
            "8192",
            "32768",
            "--steps",
            "3",
        ],
        [
            "-m",
            "bench.train",
            "--part",
            "layers",
            "--device",
            "cpu",
            "--preset",
            "debug",
            "--layers",
            "2",
            "--lengths",
            "128",
            "--steps",
            "1",
        ],
    ),
    # the longest prompt the tiny model prefills on one GPU (an hour of video is 925,200 tokens)
    Part(
        "infer",
        110,
        ["-m", "bench.infer", "--parts", "longest", "--device", "cuda"],
        ["-m", "bench.infer", "--parts", "longest", "--device", "cpu", "--longest-lengths", "512", "--chunk", "256"],
    ),
    # the lwm VQGAN's encode frames/s in bf16 (target >= 2000 on an H200)
    Part(
        "vqgan",
        50,
        [
            "-m",
            "bench.vqgan",
            "--device",
            "cuda",
            "--preset",
            "lwm",
            "--parts",
            "encode",
            "--batch-sizes",
            "16",
            "64",
            "128",
            "--frames-per-round",
            "512",
            "--rounds",
            "2",
            "--e2e-seconds",
            "0",
        ],
        [
            "-m",
            "bench.vqgan",
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--parts",
            "encode",
            "--batch-sizes",
            "1",
            "--frames-per-round",
            "2",
            "--rounds",
            "1",
            "--e2e-seconds",
            "0",
            "--no-write",
        ],
    ),
]


def preflight() -> dict:
    info = {"python": platform.python_version(), "missing": [m for m in MODULES if importlib.util.find_spec(m) is None]}
    probe = subprocess.run(
        [
            PY,
            "-c",
            "import torch, json; c = torch.cuda.is_available(); print(json.dumps("
            "{'torch': torch.__version__, 'cuda': c, 'device': torch.cuda.get_device_name() if c else None}))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    info.update(
        json.loads(probe.stdout)
        if probe.returncode == 0
        else {"torch": None, "cuda": False, "device": None, "error": probe.stderr[-2000:]}
    )
    return info


def test_counts(xml: Path) -> dict | None:
    if not xml.exists():
        return None
    suites = ET.parse(xml).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {
        "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
        "failed": n["failures"] + n["errors"],
        "skipped": n["skipped"],
    }


def run_part(part: Part, dry: bool, out: Path, env: dict) -> dict:
    cmd = part.command(dry, out)
    log = out / f"{part.name}.log"
    start = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=part.cap_s)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the part's children (e.g. spawned ranks) too
            rc, status = proc.wait(), "timed out"
    seconds = time.monotonic() - start
    lines = log.read_text(errors="replace").splitlines()
    result = {
        "name": part.name,
        "command": " ".join("python" if c == PY else c for c in cmd),
        "cap_s": part.cap_s,
        "seconds": round(seconds, 1),
        "rc": rc,
        "status": status,
        "tail": "\n".join(lines[-TAIL_LINES:]),
    }
    if part.name == "tests":
        result["tests"] = counts = test_counts(out / "tests.xml")
        if status == "ok" and counts and not dry and counts["passed"] == 0:
            result["status"] = "failed"  # on a GPU every test should run: all skipped means no CUDA
    return result


def markdown(report: dict) -> str:
    pre = report["preflight"]
    lines = [
        f"# GPU check{' (dry run on CPU)' if report['dry_run'] else ''}",
        "",
        f"Python {pre['python']}, torch {pre['torch']}, device {pre['device'] or 'none'}; "
        f"missing modules: {', '.join(pre['missing']) or 'none'}. Total {report['seconds']:.0f} s.",
        "",
        "| part | status | seconds | cap | tests | command |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for p in report["parts"]:
        t = p.get("tests")
        tests = f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped" if t else ""
        lines.append(
            f"| {p['name']} | {p['status']} | {p['seconds']:.0f} | {p['cap_s']} | {tests} | `{p['command']}` |"
        )
    for p in report["parts"]:
        lines += ["", f"## {p['name']}: {p['status']}", "", "```", p["tail"], "```"]
    return "\n".join(lines) + "\n"


def check(args) -> int:
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    pre = preflight()
    if not args.dry_run and not pre["cuda"]:
        print(
            f"gpu_check: no CUDA device here (torch {pre['torch']}); --dry-run runs the plumbing on CPU",
            file=sys.stderr,
        )
        return 2
    bench_doc = out / "benchmarks.md"
    shutil.copyfile(DOC, bench_doc)  # the benchmarks write their sections into this copy
    env = {**os.environ, "LWM_BENCH_DOC": str(bench_doc), "PYTHONWARNINGS": "ignore"}
    if args.dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU plumbing even on a machine with a GPU
    print(
        f"gpu_check: {'dry run, ' if args.dry_run else ''}device {pre['device'] or 'none'}, torch {pre['torch']}, "
        f"missing modules: {', '.join(pre['missing']) or 'none'}",
        flush=True,
    )
    start = time.monotonic()
    results = []
    for part in PARTS:
        if args.only and part.name not in args.only:
            continue
        r = run_part(part, args.dry_run, out, env)
        results.append(r)
        t = r.get("tests")
        extra = f" ({t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped)" if t else ""
        print(f"gpu_check: {r['name']}: {r['status']} in {r['seconds']:.0f} s (cap {r['cap_s']} s){extra}", flush=True)
        if r["status"] != "ok":
            print("\n".join(r["tail"].splitlines()[-15:]), flush=True)
    report = {
        "dry_run": args.dry_run,
        "preflight": pre,
        "seconds": round(time.monotonic() - start, 1),
        "parts": results,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    print(f"gpu_check: report in {out}/report.md", flush=True)
    return 0 if all(r["status"] == "ok" for r in results) else 1


GPU_SECTION = re.compile(r"<!-- bench:([\w-]*cuda) -->\n(.*?)\n<!-- /bench:\1 -->", re.S)


def record(source: Path, into: Path = DOC) -> int:
    """Copy the GPU sections of a run's benchmarks.md into `into` (docs/benchmarks.md)."""
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    found = GPU_SECTION.findall(source.read_text())
    if not found:
        print(f"gpu_check: {source} holds no GPU sections (<!-- bench:NAME-cuda -->)", file=sys.stderr)
        return 2
    for name, body in found:
        report.write_section(name, body, into)
        print(f"gpu_check: recorded {name}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run every part's plumbing on CPU with tiny shapes")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or ROOT / "gpu_check_out"),
        help="output folder (default: $OUT, which the device tool brings back)",
    )
    parser.add_argument("--into", type=Path, default=DOC, help=argparse.SUPPRESS)  # --record's destination (tests)
    parser.add_argument("--only", nargs="+", choices=[p.name for p in PARTS], help="run only these parts")
    parser.add_argument(
        "--record",
        type=Path,
        metavar="BENCHMARKS_MD",
        help="copy the GPU sections of a run's benchmarks.md into docs/benchmarks.md, and stop",
    )
    args = parser.parse_args()
    if args.record:
        return record(args.record, args.into)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
