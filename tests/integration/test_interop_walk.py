"""docs/interop.md's walk from an instruct base to a long-video model and back, run as written: its
commands block in bash with the variables its first block names set to a tiny Qwen2-style base (q/k/v bias,
a byte-level BPE tokenizer with a ChatML template and no BOS), three generated videos with questions in the
base's chat template, the bundled tiny VQGAN and a one-step stage; then its Python block on the export."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from hf_models import tiny_hf
from hf_tokenizers import qwen_folder

from lwm.data import TextTokenizer
from lwm.interop.diffusers import to_diffusers
from lwm.interop.vqgan_sources import load_vqgan
from lwm.paths import REPO
from lwm.synth import make_sample

ROOT = REPO
SECTION = "## From an instruct base to a long-video model and back"


def walk() -> tuple[str, str, str]:
    """The section's (variables, commands, python) blocks."""
    text = (ROOT / "docs" / "interop.md").read_text()
    section = text[text.index(SECTION) :].split("\n## ", 1)[0]
    bash = re.findall(r"```bash\n(.*?)```", section, re.S)
    python = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(bash) == 2 and len(python) == 1, "the walk is a block of variables, one of commands, one of Python"
    return bash[0], bash[1], python[0]


def test_the_walk_runs_as_written(tmp_path):
    variables, commands, python = walk()
    names = re.findall(r"^(\w+)=", variables, re.M)
    base = qwen_folder(tmp_path / "base")
    tiny_hf("qwen2", vocab_size=TextTokenizer(base).vocab_size + 40).save_pretrained(base)
    sample = tmp_path / "sample"
    make_sample.run(make_sample.SampleConfig(out=sample, n_videos=3))
    qa = tmp_path / "qa.jsonl"
    rows = [json.loads(line) for line in (sample / "qa.jsonl").read_text().splitlines()]
    qa.write_text(
        "".join(
            json.dumps({k: r[k] for k in ("vision", "question", "answer")} | {"fields": "chat"}) + "\n" for r in rows
        )
    )
    vqgan = tmp_path / "vqgan"  # a diffusers folder, as lwm-convert-lwm writes LWM's
    to_diffusers(load_vqgan(ROOT / "data" / "checkpoints" / "vqgan_tiny.safetensors", preset="tiny")).save_pretrained(
        vqgan
    )
    stage = "[{name:chat,seq_len:8192,rope_theta:1.0e6,steps:1,lr:1.0e-4,batch_size:1}]"
    mine = {
        "BASE": str(base),
        "VIDEOS": str(sample / "videos"),
        "QA": str(qa),
        "VQGAN": str(vqgan),
        "RUN": str(tmp_path / "run"),
        "SCHEDULE": f"schedule=video_chat schedule.stages={stage} data.num_workers=0",
    }
    assert sorted(names) == sorted(mine), f"the walk's variables are {names}"
    env = {**os.environ, **mine, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    hf = tmp_path / "run" / "hf"
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["bos_token_id"] is None
    assert (
        json.loads((hf / "lwm.json").read_text())["prompt"] == "template" and (hf / "vqgan" / "config.json").is_file()
    )
    planned = json.loads((tmp_path / "run-plan" / "plan.json").read_text())["model"]  # the base's shapes
    assert (planned["dim"], planned["qkv_bias"], planned["vocab_size"]) == (64, True, config["vocab_size"])
    assert list((tmp_path / "run-codes").glob("manifest*.jsonl"))

    exec(python.replace("runs/qwen-video/hf", str(hf)), {})  # the Python block, on the export
