"""lmms-eval with an exit status a script can trust, and the local task files on its path:

    python -m lwm.eval.lmms_run --videomme Video-MME -- --model lwm --model_args pretrained=runs/X/hf \\
        --tasks lwm_videomme_local --batch_size 1 --output_path results/lmms

`python -m lmms_eval` logs a failed evaluation (the model refusing its arguments, a task that cannot read
its data) and exits 0. This runs lmms-eval's own command line in this process and exits 1 when any
evaluation raised, or a task asked has no results; 0 when every task has. `--videomme`, `--longvideobench`
and `--mlvu` name local downloads: the task files in lwm/eval/lmms_tasks are filled with them and put on
lmms-eval's --include_path (tasks lwm_videomme_local, lwm_longvideobench_local, lwm_mlvu_local).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from lwm.eval.lmms_tasks.local import ENV

TASKS = Path(__file__).parent / "lmms_tasks"
BENCHMARKS = {"videomme": "lwm_videomme_local", "longvideobench": "lwm_longvideobench_local", "mlvu": "lwm_mlvu_local"}


def write_tasks(roots: dict[str, str], folder: Path) -> Path:
    """The task files of the benchmarks in `roots` (benchmark -> its download folder), filled, in `folder`;
    sets LWM_LMMS_<BENCHMARK> for their functions. Raises ValueError naming a folder that does not exist."""
    folder.mkdir(parents=True, exist_ok=True)
    for benchmark, where in roots.items():
        path = Path(where).expanduser().resolve()
        if not path.is_dir():
            raise ValueError(f"--{benchmark} {where}: no such folder (the benchmark's download)")
        text = (TASKS / f"{BENCHMARKS[benchmark]}.yaml").read_text()
        (folder / f"{BENCHMARKS[benchmark]}.yaml").write_text(text.replace("{root}", json.dumps(str(path))[1:-1]))
        os.environ[ENV[benchmark]] = str(path)
    return folder


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lwm.eval.lmms_run",
        allow_abbrev=False,  # lmms-eval's options pass through whole
        description=__doc__.split("\n\n")[0],
        epilog="Everything after -- (or not an option above) is lmms-eval's own: python -m lmms_eval --help.",
    )
    for benchmark, task in BENCHMARKS.items():
        p.add_argument(f"--{benchmark}", metavar="DIR", help=f"the benchmark's local download, for the task {task}")
    return p


def _asked(args) -> list[str]:
    return [t.strip() for t in (args.tasks or "").split(",") if t.strip()]


def run(harness_argv: list[str]) -> list[str]:
    """lmms-eval's command line in this process -> what failed (empty when every task asked has results)."""
    from lmms_eval import __main__ as harness

    failures: list[str] = []
    real = harness.cli_evaluate_single

    def recorded(args):
        try:
            results, samples = real(args)
        except Exception as e:  # lmms-eval prints the traceback and goes on; we keep the failure
            failures.append(f"{type(e).__name__}: {e}")
            raise
        done = (results or {}).get("results", {}) if results is not None else None
        if done is not None:  # None: not the main process, which reports
            missing = [t for t in _asked(args) if t not in done]
            failures.extend(f"task {t}: no results" for t in missing)
        return results, samples

    before = sys.argv
    sys.argv, harness.cli_evaluate_single = ["lmms_eval", *harness_argv], recorded
    try:
        harness.cli_evaluate()
    finally:
        sys.argv, harness.cli_evaluate_single = before, real
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ours, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    rest = [a for a in rest if a != "--"]
    roots = {b: getattr(ours, b) for b in BENCHMARKS if getattr(ours, b)}
    with tempfile.TemporaryDirectory(prefix="lwm_lmms_tasks_") as tmp:
        if roots:
            try:
                rest += ["--include_path", str(write_tasks(roots, Path(tmp)))]
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        failures = run(rest)
    for failure in failures:
        print(f"lmms-eval failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
