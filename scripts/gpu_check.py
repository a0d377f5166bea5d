"""The GPU check: every CUDA path's tests and the GPU halves of the benchmarks, one call.

Each part is its own process with its own time cap; a part that fails or runs out of time is
recorded and the next one runs. The output folder gets four files, well inside what the device
tool brings back from $OUT (at most 8 files of 16 MiB, 64 MiB together; a ninth is dropped
silently), and the script checks that at the end:

    report.json      per part: command, cap, seconds, exit status, test counts, output tail
    report.md        the same as a summary table, then each part's output tail
    parts.log        every part's output, in order (a part's first MiB, then its last 256 KiB)
    benchmarks.md    docs/benchmarks.md with the benchmarks' GPU sections filled in

Nothing waits for the end: the reports are rewritten before each part, every few seconds while
it runs and when it ends, and its output goes into parts.log line by line, so a part (or a whole
call) cut off by a time limit keeps what it measured. The benchmarks write their own sections
into benchmarks.md when they finish. The tests' junit XML stays in a temporary folder; its counts
and failures go into the reports.

    python scripts/gpu_check.py --plan-ahead   # here, before: the plans the parts compare against
    scripts/gpu_check.sh                       # on a machine with a GPU (see that file's header)
    scripts/gpu_check.sh --dry-run --out DIR   # the same plumbing on CPU, tiny shapes, seconds
    python scripts/gpu_check.py --record DIR/benchmarks.md   # copy a run's GPU sections into docs/

One file for one command (longer than most for that reason): the parts, their runner, the reports and --record.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
PLANS = ROOT / ".gpu_check" / "plans.json"  # made here by --plan-ahead; the device run is carried it
PY = sys.executable
# What the check imports, by import name; a missing one is reported before anything runs.
MODULES = ("torch", "lightning", "hydra", "omegaconf", "transformers", "sentencepiece", "safetensors", "pytest")
# Distributions whose versions the preflight records (the device's own or the carried ones).
VERSIONS = ("torch", "lightning", "hydra-core", "omegaconf", "transformers", "pytest", "pluggy", "tabulate")
TAIL_LINES = 60  # of each part's output in the reports
LINE_CHARS = 500  # a longer line is cut in the reports (parts.log keeps it)
LOG = "parts.log"
LOG_HEAD_BYTES = 2**20  # per part: the first MiB of output goes to parts.log as it comes,
LOG_TAIL_BYTES = 2**18  # then only the last 256 KiB, appended when the part ends (6 parts < 8 MiB)
PUBLISH_EVERY_S = 5.0  # the reports show a running part's output this often
# What the device tool brings back from $OUT: at most 8 files, 16 MiB each, 64 MiB together, two
# folders deep, named in letters, digits, '.', '_' and '-' (the device tool's README, Limits).
MAX_FILES, MAX_FILE_BYTES, MAX_TOTAL_BYTES, MAX_DEPTH = 8, 16 * 2**20, 64 * 2**20, 2
FILE_NAME = re.compile(r"[A-Za-z0-9._-]+")


@dataclass
class Part:
    name: str
    cap_s: int  # the GPU run's caps add up to 470 s: 8 minutes with the preflight
    gpu: list[str]  # arguments after the interpreter
    dry: list[str]  # the same entry point on CPU with tiny shapes
    env: dict[str, str] = field(default_factory=dict)  # set for this part alone

    def command(self, dry: bool, tmp: Path, plans: Path | None = None) -> list[str]:
        """plans: a plans file made beforehand (--plan-ahead), read by the parts that compare against lwm-plan."""
        args = self.dry if dry else self.gpu
        extra = ["--plans", str(plans)] if plans is not None and self.plans_ahead(dry) else []
        return [PY, *(a.replace("{tmp}", str(tmp)) for a in args), *extra]

    def plans_ahead(self, dry: bool) -> list[str] | None:
        """The command that makes this part's plans beforehand, without a GPU (bench.train --part plans with
        the part's own arguments), or None for a part that plans nothing."""
        args = self.dry if dry else self.gpu
        if args[:2] != ["-m", "bench.train"]:
            return None
        i = args.index("--part") + 1
        return [PY, *args[:i], "plans", *args[i + 1 :]]


TESTS = [
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:cacheprovider",
    "tests/integration/test_gpu.py",
    "tests/unit/parallel/test_parallel_gpu.py",
    "--junitxml",
    "{tmp}/tests.xml",  # read for the counts; not one of the files brought back
]
# The device's own pytest plugins (pytest-xdist, -timeout, -benchmark, hypothesis, ...) are built
# for its pytest; none is needed here, and one that breaks on import would stop collection.
NO_PLUGIN_AUTOLOAD = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
PARTS = [
    # ring / Ulysses / hybrid and document masks on CUDA, a one-GPU bf16 training step, the KV cache
    Part("tests", 95, TESTS, TESTS, NO_PLUGIN_AUTOLOAD),
    # the ring schedule over simulated ranks vs one fused SDPA flash call, bf16, fwd+bwd
    Part(
        "attention",
        75,
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
    # a few layers of the 7b preset: FSDP2 bf16, activation checkpointing, 8K and 32K tokens, beside lwm-plan's plan,
    # under each attention kernel installed (FlashAttention-2 first: the others as speed-ups over it)
    Part(
        "train",
        70,
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
            "--kernels",
            "fa2",
            "fa3",
            "fa4",
            "cudnn",
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
            "--kernels",
            "fa2",
            "fa3",
            "fa4",
            "cudnn",
        ],
    ),
    # the same 4 layers at 32K and 128K: checkpointing alone, + offload, + tiling (head groups, norm and MLP
    # chunks), kept attention with offload (no attention forward in the recompute); peak, host bytes and step
    # time as ratios, beside the plan (each row published as it ends)
    Part(
        "memory",
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
            "32768",
            "131072",
            "--steps",
            "1",
            "--features",
            "checkpointing",
            "offload",
            "tiled",
            "kept_offload",
            "--head-groups",
            "4",
            "--chunk",
            "16384",
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
            "--features",
            "checkpointing",
            "offload",
            "tiled",
            "kept_offload",
            "--head-groups",
            "2",
            "--chunk",
            "64",
        ],
    ),
    # the longest prompt the tiny model prefills on one GPU (an hour of video is 925,200 tokens)
    Part(
        "infer",
        90,
        ["-m", "bench.infer", "--parts", "longest", "--device", "cuda"],
        ["-m", "bench.infer", "--parts", "longest", "--device", "cpu", "--longest-lengths", "512", "--chunk", "256"],
    ),
    # the lwm VQGAN's encode frames/s in bf16 (target >= 2000 on an H200)
    Part(
        "vqgan",
        40,
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
    versions = {}
    for name in VERSIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    info["versions"] = versions
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
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {
        "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
        "failed": n["failures"] + n["errors"],
        "skipped": n["skipped"],
        "failed_tests": failed[:50],
    }


class Capture:
    """A part's output into parts.log, bounded: the first LOG_HEAD_BYTES as they come (a call cut
    off mid-part keeps them), then the last LOG_TAIL_BYTES, appended when the part ends."""

    def __init__(self, log: Path, name: str, cmd: str):
        self.file = open(log, "a", encoding="utf-8", errors="replace")
        self.file.write(f"===== {name}: {cmd}\n")
        self.file.flush()
        self.lock = threading.Lock()
        self.head = 0  # bytes written as they came
        self.late: deque[bytes] = deque()  # output past the head, at most LOG_TAIL_BYTES of it
        self.late_bytes = self.trimmed = 0
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)  # for the reports

    def read(self, stream) -> None:
        for chunk in iter(lambda: stream.readline(65536), b""):  # a line, or 64 KiB of a longer one
            with self.lock:
                if self.file.closed:
                    return
                self.tail.append(chunk.decode(errors="replace").rstrip("\n")[:LINE_CHARS])
                if not self.late and self.head + len(chunk) <= LOG_HEAD_BYTES:
                    self.file.write(chunk.decode(errors="replace"))
                    self.file.flush()
                    self.head += len(chunk)
                    continue
                self.late.append(chunk)
                self.late_bytes += len(chunk)
                while self.late_bytes > LOG_TAIL_BYTES:
                    self.late_bytes -= len(dropped := self.late.popleft())
                    self.trimmed += len(dropped)

    def text(self) -> str:
        with self.lock:
            return "\n".join(self.tail)

    def close(self, status: str) -> None:
        with self.lock:
            if self.trimmed:
                self.file.write(f"\n..... {self.trimmed} bytes of output left out here .....\n")
            self.file.write(b"".join(self.late).decode(errors="replace"))
            self.file.write(f"\n===== {status}\n\n")
            self.file.close()


def run_part(
    part: Part, dry: bool, out: Path, env: dict, tmp: Path | None = None, progress=None, plans: Path | None = None
) -> dict:
    """Run one part under its cap, its output into out/parts.log; `progress(result)` is called
    every PUBLISH_EVERY_S while it runs, with the result so far; plans: the file of plans made ahead."""
    tmp = tmp or out
    cmd = part.command(dry, tmp, plans)
    shown = " ".join("python" if c == PY else c for c in cmd)
    capture = Capture(out / LOG, part.name, shown)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**env, **part.env},
        start_new_session=True,
    )
    reader = threading.Thread(target=capture.read, args=(proc.stdout,), daemon=True)
    reader.start()

    def result(status, rc=None) -> dict:
        return {
            "name": part.name,
            "command": shown,
            "env": part.env,
            "cap_s": part.cap_s,
            "seconds": round(time.monotonic() - start, 1),
            "rc": rc,
            "status": status,
            "log_trimmed_bytes": capture.trimmed,
            "tail": capture.text(),
        }

    while True:
        left = start + part.cap_s - time.monotonic()
        try:
            rc = proc.wait(timeout=max(0.0, min(PUBLISH_EVERY_S, left)))
            status = "ok" if rc == 0 else "failed"
            break
        except subprocess.TimeoutExpired:
            if left <= PUBLISH_EVERY_S:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the part's children (e.g. spawned ranks) too
                rc, status = proc.wait(), "timed out"
                break
            if progress:
                progress(result("running"))
    reader.join(timeout=10)  # a child that left the process group may hold the pipe open: go on
    capture.close(status)
    r = result(status, rc)
    if part.name == "tests":
        r["tests"] = counts = test_counts(tmp / "tests.xml")
        if status == "ok" and counts and not dry and counts["passed"] == 0:
            r["status"] = "failed"  # on a GPU every test should run: all skipped means no CUDA
    return r


def markdown(report: dict) -> str:
    pre = report["preflight"]
    versions = ", ".join(f"{k} {v}" for k, v in pre.get("versions", {}).items())
    lines = [
        f"# GPU check{' (dry run on CPU)' if report['dry_run'] else ''}",
        "",
        f"Python {pre['python']}, torch {pre['torch']}, device {pre['device'] or 'none'}; "
        f"missing modules: {', '.join(pre['missing']) or 'none'}{'; ' + versions if versions else ''}. "
        f"{'Total' if report['done'] else 'Still running; so far'} {report['seconds']:.0f} s.",
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
    lines += [f"| {p.name} | not started | | {p.cap_s} | | |" for p in report["pending"]]
    for p in report["parts"]:
        trimmed = f" ({p['log_trimmed_bytes']} bytes left out of its middle)" if p["log_trimmed_bytes"] else ""
        lines += ["", f"## {p['name']}: {p['status']}", "", f"Whole output in {LOG}{trimmed}; its end:", ""]
        failed = (p.get("tests") or {}).get("failed_tests")
        lines += [f"- failed: `{t}`" for t in failed or []] + ([""] if failed else [])
        lines += ["```", p["tail"], "```"]
    if report.get("out"):
        lines += ["", f"Files brought back: {report['out']}."]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict) -> None:
    """report.json and report.md, each replaced whole (a reader never sees half a file)."""
    data = {**report, "pending": [p.name for p in report["pending"]]}
    for name, text in (("report.json", json.dumps(data, indent=2) + "\n"), ("report.md", markdown(report))):
        part = out / f"{name}.part"
        part.write_text(text)
        os.replace(part, out / name)


def out_problems(out: Path) -> tuple[dict[str, int], list[str]]:
    """The files under `out` (name -> bytes) and what the device tool would not bring back."""
    files = {str(f.relative_to(out)): f.stat().st_size for f in sorted(out.rglob("*")) if f.is_file()}
    problems = []
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files, more than {MAX_FILES}: {', '.join(files)}")
    problems += [f"{n} has {b} bytes, more than {MAX_FILE_BYTES}" for n, b in files.items() if b > MAX_FILE_BYTES]
    if sum(files.values()) > MAX_TOTAL_BYTES:
        problems.append(f"{sum(files.values())} bytes in all, more than {MAX_TOTAL_BYTES}")
    for n in files:
        parts = Path(n).parts
        if len(parts) > MAX_DEPTH + 1 or not all(FILE_NAME.fullmatch(p) for p in parts):
            problems.append(f"{n}: too deep or a name the device tool does not bring back")
    return files, problems


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
    (out / LOG).write_text("")
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
    plans = args.plans if args.plans.is_file() else None
    pre["plans"] = str(plans) if plans else None
    print(
        f"gpu_check: plans made ahead in {plans}"
        if plans
        else f"gpu_check: no {args.plans}: each part plans on the device",
        flush=True,
    )
    start = time.monotonic()
    parts = selected(args)
    report = {"dry_run": args.dry_run, "done": False, "preflight": pre, "seconds": 0.0, "parts": [], "pending": parts}

    def publish(running: dict | None = None) -> None:
        report["seconds"] = round(time.monotonic() - start, 1)
        finished = report["parts"]
        write_report(out, {**report, "parts": finished + [running] if running else finished})

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:  # the junit XML, not brought back
        for i, part in enumerate(parts):
            report["pending"] = parts[i:]
            publish()  # this part shows as not started until it has run PUBLISH_EVERY_S
            report["pending"] = parts[i + 1 :]
            r = run_part(part, args.dry_run, out, env, Path(tmp), progress=publish, plans=plans)
            report["parts"].append(r)
            publish()
            t = r.get("tests")
            extra = f" ({t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped)" if t else ""
            print(
                f"gpu_check: {r['name']}: {r['status']} in {r['seconds']:.0f} s (cap {r['cap_s']} s){extra}", flush=True
            )
            if r["log_trimmed_bytes"]:
                print(f"gpu_check: {r['name']}: {r['log_trimmed_bytes']} bytes of its output left out of {LOG}")
            if r["status"] != "ok":
                print("\n".join(r["tail"].splitlines()[-15:]), flush=True)
    report.update(done=True, pending=[])
    files, _ = out_problems(out)
    report["out"] = f"{len(files)} files (the device tool takes {MAX_FILES}), " + ", ".join(
        f"{n} {b / 1024:.0f} KiB" for n, b in files.items()
    )
    publish()
    files, problems = out_problems(out)  # again, with the final reports' sizes
    print(
        f"gpu_check: report in {out}/report.md; {out} holds {len(files)} files, {sum(files.values())} bytes", flush=True
    )
    for p in problems:
        print(f"gpu_check: the device tool would not bring this back: {p}", file=sys.stderr)
    if problems:
        return 3
    return 0 if all(r["status"] == "ok" for r in report["parts"]) else 1


def selected(args) -> list[Part]:
    return [p for p in PARTS if not args.only or p.name in args.only]


def plan_ahead(args) -> int:
    """Make, here and without a GPU, the plans the parts compare their measurements against (--plans)."""
    args.plans.unlink(missing_ok=True)  # made whole for this check: none left from another
    for part in selected(args):
        cmd = part.plans_ahead(args.dry_run)
        if cmd is None:
            continue
        print(f"gpu_check: {part.name}: {' '.join(cmd[1:])} --plans {args.plans}", flush=True)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}
        if subprocess.run([*cmd, "--plans", str(args.plans)], cwd=ROOT, env=env).returncode != 0:
            print(f"gpu_check: planning {part.name} ahead failed; it will plan on the device", file=sys.stderr)
            return 1
    return 0


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
        "--plans",
        type=Path,
        default=PLANS,
        help=f"the plans made ahead: --plan-ahead writes them, the check reads them (default {PLANS.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--plan-ahead",
        action="store_true",
        help="make the plans the parts compare against here, without a GPU (with --dry-run: the dry run's), and stop",
    )
    parser.add_argument(
        "--record",
        type=Path,
        metavar="BENCHMARKS_MD",
        help="copy the GPU sections of a run's benchmarks.md into docs/benchmarks.md, and stop",
    )
    args = parser.parse_args()
    if args.record:
        return record(args.record, args.into)
    if args.plan_ahead:
        return plan_ahead(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
