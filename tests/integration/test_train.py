"""train.py end to end in one process: configs, resume, stage hand-over, output, refusals and bad
input. Runs are subprocesses or train.py's main in this process; the multi-process runs are in
tests/integration/test_train_parallel.py.

Longer than most test files: one subject's tests kept together, beside the helpers they share.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file
from train_runs import DEBUG, ROOT, STOPPED, forked_train, losses, main_in_process, train

from lwm.core.config import to_run_config, validate
from lwm.disk.checkpoints import load_verified

CONF = ROOT / "conf"


def test_every_config_composes():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for group in ("model", "data", "parallel", "schedule", "trainer", "optim"):
            for option in sorted(p.stem for p in (CONF / group).glob("*.yaml")):
                overrides = [f"{group}={option}", "schedule.init_hf=null"]
                if group == "data" and option == "custom":
                    overrides += [
                        "data.tokenizer=data/sample/tokenizer.model",
                        "data.sources={qa: {path: data/sample/qa.jsonl}}",
                    ]
                cfg = compose("train", overrides=overrides)
                run = to_run_config(cfg)
                assert run.schedule.stages and run.model.dim > 0, (group, option)
        for experiment in sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")):
            cfg = compose("train", overrides=[f"+experiment={experiment}", "schedule.init_hf=null"])
            if OmegaConf.missing_keys(cfg):  # an experiment for the user's own data
                cfg = compose(
                    "train",
                    overrides=[
                        f"+experiment={experiment}",
                        "schedule.init_hf=null",
                        "data.tokenizer=data/sample/tokenizer.model",
                        "data.sources={qa: {path: data/sample/qa.jsonl}}",
                    ],
                )
            assert to_run_config(cfg).schedule.stages, experiment


def test_default_run_config_is_valid():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        run = to_run_config(compose("train"))
    validate(run)
    assert [s.seq_len for s in run.schedule.stages] == [128, 512, 2048] == run.evaluate.lengths
    assert len({s.rope_theta for s in run.schedule.stages}) == 3 and run.model.vocab_size == 12352


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["trainer.devices=2", "+schedule.stages.0.cp=4"], "world size 2 is not divisible by cp 4"),
        (
            ["+schedule.stages.0.cp=2", "trainer.devices=2", "parallel=zigzag", "schedule.stages.0.seq_len=66"],
            r"seq_len 66 is not divisible by 2 \* ring size = 4 \(zigzag\)",
        ),
        (["schedule.init_hf=/no/such/model"], "schedule.init_hf: /no/such/model is not a Hugging Face model folder"),
        (
            [
                "data=custom",
                "data.tokenizer=data/sample/tokenizer.model",
                "data.codes=/tmp",
                "data.sources={text: {path: data/sample/text.jsonl}}",
            ],
            "data.codes /tmp has no manifest",
        ),
        (["stage_only=zz"], "stage_only 'zz' is not a stage"),
        (["data.sources.text.path=/no/such.jsonl"], "data.sources.text.path /no/such.jsonl does not exist"),
        (
            ["data.sources.text.path=README.md"],
            r"data.sources.text.path README.md: expected a JSON-lines \(.jsonl, .json\), parquet \(.parquet\), table "
            r"\(.csv, .tsv: a header row, then a row an example\) or webdataset shard \(.tar\) file",
        ),
        (["data=custom"], r"data.sources, data.tokenizer must be given \(no default\), e.g. data.sources="),
        (
            ["data=custom", "data.tokenizer=data/sample/tokenizer.model", "data.sources={text: {pth: x}}"],
            r"data.sources.text: unknown key\(s\) \['pth'\] for Source; expected some of \['conversation', 'direction', "
            r"'fields', 'media', 'media_root', 'overflow', 'path', 'repeat', 'roles'\]",
        ),
        (["resume=true"], "resume=true: trainer.out_dir .* does not exist"),
        (["evaluate.lengths=[128]", "evaluate.haystack=/no/such.txt"], "evaluate.haystack /no/such.txt does not exist"),
        (["evaluate.trials=0"], r"evaluate.trials must be >= 1, got 0"),
        (["trainer.devices=0"], r"trainer.devices must be >= 1, got 0"),
        (["trainer.devices=2", "parallel.tp=4"], r"stage 'a' .*: world size 2 is not divisible by cp 1 x tp 4"),
        (
            ["trainer.devices=3", "parallel.tp=3"],
            r"stage 'a' .*: tp 3 must divide the q heads \(4\) and the kv heads \(2\)",
        ),
        (["parallel.ulysses=2"], r"ulysses 2 is hybrid mode's all-to-all size; mode is 'ring'"),
        (
            ["trainer.devices=4", "+schedule.stages.0.cp=4", "parallel.mode=hybrid", "parallel.ulysses=3"],
            r"ulysses 3 must divide cp",
        ),
        (
            ["parallel.activation_offload=true"],
            r"parallel.activation_offload=true needs parallel.activation_checkpointing=true",
        ),
        (
            [
                "parallel.activation_checkpointing=true",
                "parallel.keep_attention=true",
                "parallel.keep_attention_blocks=3",
            ],
            r"parallel.keep_attention_blocks=3: the model has 2 blocks",
        ),
        (
            ["parallel.attention_kernel=fa9"],
            r"parallel.attention_kernel must be one of \['auto', 'fa2', 'fa3', 'fa4', 'cudnn'\]",
        ),
        (["parallel.attention_kernel=fa4"], r"parallel.attention_kernel=fa4: FlashAttention-4 runs on CUDA GPUs .*cpu"),
        (
            ["parallel.attention_kernel=cudnn"],
            r"parallel.attention_kernel=cudnn: cuDNN attention runs on CUDA GPUs .*cpu",
        ),
        (["stop_at_step=-1"], r"stop_at_step must be >= 1 \(null: run each stage to its end\), got -1"),
        (["stop_at_step=0"], r"stop_at_step must be >= 1 .*, got 0"),
        (["trainer.out_dir=README.md"], r"trainer.out_dir README.md is a file; name a folder"),
        (
            ["data=custom", "data.tokenizer=README.md", "data.sources={t: {path: README.md}}"],
            r"README.md is not a sentencepiece model",
        ),
        (["trainer.timeout_s=-1"], r"trainer.timeout_s must be >= 1, got -1"),
        (["trainer.checkpoint_every=-2"], r"trainer.checkpoint_every .* must be >= 0, got -2"),
        (["trainer.precision=fp7"], r"trainer.precision must be one of .*'bf16-mixed'.*, got 'fp7'"),
        # lwm.configs.from_dict: unknown keys and wrong types, named by their key path
        (["+trainer.devicez=2"], r"trainer: unknown key\(s\) \['devicez'\] for TrainerConfig"),
        (["trainer.devices=two"], r"trainer.devices: expected an integer, got 'two'"),
        (["model.dim=1.5"], r"model.dim: expected an integer, got 1.5"),
        (["+model.preset=tiny"], r"model: unknown key\(s\) \['preset'\] for ModelConfig"),
        (["optim.betas=[0.9]"], r"optim.betas: expected 2 values, got \[0.9\]"),
        (["schedule.stages.0.steps=many"], r"schedule.stages\[0\].steps: expected an integer, got 'many'"),
        (["+evaluate.trails=3"], r"evaluate: unknown key\(s\) \['trails'\] for NeedleGrid"),
        (
            ["data.max_skipped_fraction=1.5"],
            r"data.max_skipped_fraction must lie in \[0, 1\] \(1: never stop\), got 1.5",
        ),
        (["data.max_line_bytes=0"], r"data.max_line_bytes must be >= 1, got 0"),
        (["data.index_dir=README.md/indexes"], r"data.index_dir README.md/indexes cannot be written: README.md is not"),
    ],
)
def test_bad_input_is_refused_before_the_run(tmp_path, overrides, message, monkeypatch, capsys):
    """A rejected command exits 2 with the message and writes nothing (no run folder at all).
    train.py's main runs in this process (as `python train.py ...` would, minus the start-up)."""
    import importlib.util
    import re

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["train.py", f"trainer.out_dir={tmp_path / 'run'}", *DEBUG, *overrides])
    spec = importlib.util.spec_from_file_location("__main__", ROOT / "train.py")  # run as a script: conf/ beside it
    with pytest.raises(SystemExit) as exit_:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and re.search(message, err), err[-2000:]
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_unknown_config_name(tmp_path, monkeypatch, capsys):
    code, err = _main_exit(monkeypatch, capsys, tmp_path, "model=huge")
    assert code == 2 and "Could not find 'model/huge'" in err and "tiny" in err, err[-2000:]


def test_resume_gives_the_same_losses(tmp_path, reference, monkeypatch, capsys):
    """Stopped at step 5 (after a periodic checkpoint at 3): a flipped byte in last.ckpt is refused on
    resume, exit 2 naming it; the intact one resumes to the uninterrupted losses, every row kept."""
    forked_train(tmp_path, "stage_only=a", "stop_at_step=5", "trainer.checkpoint_every=3", expect=STOPPED)
    last = tmp_path / "a" / "checkpoints" / "last.ckpt"
    assert last.exists() and not (tmp_path / "a" / "final.safetensors").exists()
    assert load_verified(last)["global_step"] == 5  # the stop's own, not the periodic one of step 3
    assert set(torch.load(last, weights_only=True)["rng_states"]) == {"0"}
    good = last.read_bytes()
    last.write_bytes(good[:-100] + bytes([good[-100] ^ 0xFF]) + good[-99:])
    with monkeypatch.context() as patch:  # train.py's main in this process: the refusal comes before any step
        code, err = _main_exit(patch, capsys, tmp_path, "stage_only=a", "resume=true")
    assert code == 2 and f"{last} does not match its checksum" in err, err[-3000:]
    last.write_bytes(good)
    proc = forked_train(tmp_path, "stage_only=a", "resume=true")
    got = losses(tmp_path)
    assert sorted(got) == list(range(10))  # the rows from before the stop are kept, through the refused resume too
    for step in range(10):
        assert got[step] == pytest.approx(reference[step], rel=1e-6), step
    # the bar counts the stage's steps from where it stopped, not Lightning's epochs
    assert " 5/10 " in proc.stdout and "10/10 " in proc.stdout and "Epoch" not in proc.stdout, proc.stdout[-1000:]


def test_output_one_line_per_stage_and_one_checkpoint(tmp_path):
    """What a run prints and leaves: a line per stage, a clean bar, no Lightning chatter; a finished
    stage keeps its final weights, and last.ckpt only with trainer.keep_checkpoints=true; stage b
    starts from stage a's final weights."""
    proc = train(tmp_path, "trainer.checkpoint_every=3")
    check_stage_hand_over(tmp_path)
    text = proc.stdout + proc.stderr
    assert text.count("stage a: seq_len 64, rope_theta 10000, 10 steps, cp 1, dp 1") == 1, text[-2000:]
    assert text.count("stage b: seq_len 128, rope_theta 100000, 4 steps, cp 1, dp 1") == 1
    for noise in ("Seed set to", "GPU available", "Tip:", "v_num", "LeafSpec"):
        assert noise not in text, noise
    assert (tmp_path / "config.yaml").exists() and not list(tmp_path.glob("**/hydra"))
    assert not (tmp_path / "needle").exists()  # evaluate.lengths=null: no evaluation after the run
    for stage in "ab":
        assert (tmp_path / stage / "final.safetensors").exists() and not (tmp_path / stage / "checkpoints").exists()
    proc = forked_train(
        tmp_path / "keep",
        "stage_only=a",
        "trainer.checkpoint_every=3",
        "trainer.keep_checkpoints=true",
        "trainer.preflight=true",
    )
    assert "preflight: stage 'a' (seq_len 64, cp 1, dp 1" in proc.stdout and ": fits" in proc.stdout, proc.stdout[
        -2000:
    ]
    kept = tmp_path / "keep" / "a" / "checkpoints"
    assert sorted(p.name for p in kept.iterdir()) == ["last.ckpt", "last.ckpt.sha256"]  # and no temporary file
    assert load_verified(kept / "last.ckpt")["global_step"] == 10


def check_stage_hand_over(tmp_path):
    """Stage b starts from stage a's final weights: its first loss is their loss under b's theta."""

    from lwm.data import DataConfig, Source
    from lwm.model import ModelConfig, Transformer, token_coefficients
    from lwm.train.datamodule import LWMDataModule

    cfg = ModelConfig(**__import__("json").loads((tmp_path / "b" / "model_config.json").read_text()))
    model = Transformer(cfg)
    model.load_state_dict(load_file(tmp_path / "a" / "final.safetensors"))
    data = DataConfig(
        sources=[Source("data/sample/text.jsonl", fields="text", overflow="window")],
        tokenizer=str(ROOT / "data/sample/tokenizer.model"),
        batch_size=1,
    )
    data.sources[0].path = str(ROOT / data.sources[0].path)
    dm = LWMDataModule(data, seq_len=128)
    batch = dm.on_before_batch_transfer(next(iter(dm.train_dataloader())))
    with torch.no_grad():
        coeff = token_coefficients(batch["loss_weight"], batch["vision_mask"])
        loss = model(batch["tokens"], batch["positions"], targets=batch["targets"], loss_coeff=coeff).loss
    assert losses(tmp_path, "b")[0] == pytest.approx(loss.item(), rel=1e-5)
    assert (tmp_path / "hf").exists() is False  # export=false in these runs


def test_first_stage_from_hugging_face(tmp_path):
    """schedule.init_hf: a LLaMA folder with the text vocabulary only; the model takes its shapes and
    grows the vocabulary for vision (text rows kept)."""
    import json

    from transformers import LlamaConfig, LlamaForCausalLM

    hf_dir = tmp_path / "llama"
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(hf_dir)
    out = tmp_path / "run"
    forked_train(
        out,
        "stage_only=a",
        f"schedule.init_hf={hf_dir}",
        "schedule.stages.0.steps=2",
        "parallel.activation_checkpointing=true",
    )
    cfg = json.loads((out / "a" / "model_config.json").read_text())
    assert (cfg["dim"], cfg["n_kv_heads"], cfg["vocab_size"], cfg["rope_theta"]) == (48, 2, 12352, 10000)
    weights = load_file(out / "a" / "final.safetensors")
    assert weights["embed.weight"].shape == (12352, 48)


def test_a_start_from_an_exported_folder_keeps_its_vocabulary(tmp_path, monkeypatch, capsys):
    """A folder this project exported (its tokenizer holds the vision tokens) starts a run with its
    rows as they are. They were grown for vision once more (12352 -> 20608 rows), the run trained on,
    and its own export failed at the end on the rows its tokenizer does not make. A start whose rows
    the data's tokenizer does not make is refused before anything is written."""
    from lwm.interop.hf import start_config, to_hf
    from lwm.model import ModelConfig, Transformer
    from lwm.train.run import hf_start

    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug").replace(vocab_size=12352))  # the sample's 4096 ids
    folder = to_hf(model, tmp_path / "hf", tokenizer_model="data/sample/tokenizer.model")
    config, _ = start_config(folder)
    read = hf_start(folder)
    assert config.vocab_size == 12352
    state = read()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())

    other = tmp_path / "other"  # a tokenizer's vision tokens from id 5000: 13248 rows, not the sample's 12352
    to_hf(Transformer(ModelConfig.from_preset("debug").replace(vocab_size=13248)), other, tokenizer_model=None)
    (other / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 5000, "content": "<vision_0>"}]}))
    code, err = _main_exit(monkeypatch, capsys, tmp_path / "run", "stage_only=a", f"schedule.init_hf={other}")
    assert code == 2 and "starts a model of 13248 vocabulary rows, but data.tokenizer" in err, err[-2000:]
    assert not (tmp_path / "run").exists()


def test_random_state_is_saved_and_restored():
    """What the module writes into a checkpoint brings back the exact random streams."""
    import random

    import numpy as np

    from lwm.train.module import LWMModule

    module = LWMModule.__new__(LWMModule)
    module.check_weights = lambda when: None  # no model here; the weights' check: tests/integration/test_guard.py
    module.nonfinite_steps = 0
    checkpoint: dict = {}
    torch.manual_seed(3)
    module.on_save_checkpoint(checkpoint)
    expected = (torch.rand(4), np.random.rand(), random.random())
    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    module.on_load_checkpoint(checkpoint)
    got = (torch.rand(4), np.random.rand(), random.random())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_one_gpu_trains_through_fsdp2_and_one_cpu_process_plainly():
    """bf16 compute on fp32 master weights is FSDP2's mixed precision (lwm/parallel/parallelize.py), so a
    single GPU gets the strategy too; tests/integration/test_gpu.py checks the dtypes on a device."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lwm.core.config import TrainerConfig
    from lwm.parallel import ParallelDims
    from lwm.train.trainer import strategy as _strategy

    assert _strategy(ParallelDims(), TrainerConfig(accelerator="cpu")) == "auto"
    gpu = _strategy(ParallelDims(), TrainerConfig(accelerator="gpu"))
    assert isinstance(gpu, ModelParallelStrategy)
    assert (gpu._data_parallel_size, gpu._tensor_parallel_size) == (1, 1)


KILL_IN_SECOND_CHECKPOINT = """
import builtins, os, runpy, signal, sys
real_open, opened = builtins.open, []

class KilledHalfway:
    # The second checkpoint's file: the process is killed once half a checkpoint's bytes are on disk
    def __init__(self, f, half):
        self.f, self.half, self.written = f, half, 0
    def write(self, data):
        n = self.f.write(data)
        self.written += n
        if self.written >= self.half:
            self.f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return n
    def __getattr__(self, name):
        return getattr(self.f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self.f.__exit__(*exc)

def open_(file, mode="r", *args, **kwargs):
    name = os.path.basename(str(file))
    if "w" in mode and "last.ckpt" in name and "sha256" not in name:
        opened.append(name)
        if len(opened) == 2:  # the second checkpoint, as big as the first one beside it
            first = os.path.join(os.path.dirname(str(file)), "last.ckpt")
            return KilledHalfway(real_open(file, mode, *args, **kwargs), os.path.getsize(first) // 2)
    return real_open(file, mode, *args, **kwargs)
builtins.open = open_
sys.argv = sys.argv[1:]  # ["train.py", overrides...]
runpy.run_path("train.py", run_name="__main__")
"""


def mounted_tmpfs(tmp_path, size: str):
    """A folder on a filesystem of its own (a tmpfs of `size`), as a scratch or network volume is."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def tmpfs(tmp_path):
    yield from mounted_tmpfs(tmp_path, "256m")


def test_a_kill_inside_a_checkpoint_write_loses_nothing(tmpfs, reference):
    """Killed halfway through writing its second checkpoint on another filesystem than $TMPDIR, the run
    keeps the first one whole, and resuming from it gives the one-process losses."""
    out = tmpfs / "run"
    args = ["stage_only=a", "trainer.checkpoint_every=2"]
    killed = train(out, *args, launcher=[sys.executable, "-c", KILL_IN_SECOND_CHECKPOINT], check=False)
    assert killed.returncode == -9, killed.stderr[-2000:]
    checkpoints = out / "a" / "checkpoints"
    assert 0 < (checkpoints / "last.ckpt.tmp").stat().st_size < (checkpoints / "last.ckpt").stat().st_size
    assert load_verified(checkpoints / "last.ckpt")["global_step"] == 2  # the first, intact
    forked_train(out, *args, "resume=true")
    got = losses(out)
    assert set(range(2, 10)) <= set(got) and (out / "a" / "final.safetensors").exists()
    for step, loss in got.items():
        assert loss == pytest.approx(reference[step], rel=1e-6), step


def _main_exit(monkeypatch, capsys, out, *overrides) -> tuple[int, str]:
    """(exit status, stderr) of train.py's main in this process."""
    code, _, err = main_in_process(monkeypatch, capsys, out, *overrides)
    return code, err


def test_preflight_stops_a_stage_that_will_not_fit(tmp_path, monkeypatch, capsys, caplog):
    """trainer.preflight=true plans the stage on the device's memory (here made 1 MiB) and stops
    before anything is allocated, naming the stage, its peak and the device. The folder's lock, left
    by a run that died, is taken over and the warning saying so reaches the log: Hydra's logging
    config must not silence the project's loggers."""
    import json
    import socket

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = {"pid": int(dead.stdout), "host": socket.gethostname(), "command": "train.py", "since": "then"}
    (tmp_path / "train.lock").write_text(json.dumps(holder))
    monkeypatch.setattr("lwm.train.run.device_memory", lambda kind, ranks: 2**20)
    code, err = _main_exit(monkeypatch, capsys, tmp_path, "stage_only=a", "trainer.preflight=true")
    assert code == 2 and "preflight: stage 'a' (seq_len 64" in err and "it will not fit" in err, err[-2000:]
    assert "on a device of 1.00 MiB" in err and not (tmp_path / "a" / "final.safetensors").exists()
    assert f"taking over {tmp_path / 'train.lock'} from pid {holder['pid']}" in caplog.text


def test_a_second_run_on_one_folder_is_refused(tmp_path, monkeypatch, capsys):
    from lwm.disk.folder_lock import output_lock

    with output_lock(tmp_path, "train"):
        code, err = _main_exit(monkeypatch, capsys, tmp_path, "stage_only=a")
    assert code == 2 and f"is in use by another run (pid {os.getpid()}" in err, err[-2000:]
    assert not (tmp_path / "a").exists()


def test_the_runs_export_folder_is_checked_before_the_run(tmp_path, monkeypatch, capsys):
    """export=true writes out_dir/hf as lwm.train.export does: a folder holding files it did not make,
    or a symlink, is refused before the training (exit 2), not deleted into after it."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "model-00001-of-00003.safetensors").write_bytes(b"not ours")
    code, err = _main_exit(monkeypatch, capsys, tmp_path, "stage_only=a", "export=true")
    assert code == 2 and f"export=true: {tmp_path / 'hf'} holds files an export did not make" in err, err[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no config.yaml, no stage folder
    (tmp_path / "hf").rename(tmp_path / "elsewhere")
    (tmp_path / "hf").symlink_to(tmp_path / "elsewhere")
    code, err = _main_exit(monkeypatch, capsys, tmp_path, "stage_only=a", "export=true")
    assert code == 2 and f"{tmp_path / 'hf'} is a symlink to {tmp_path / 'elsewhere'}" in err, err[-2000:]


@pytest.mark.parametrize(
    "change,message",
    [
        # tried to allocate 256 GB building the model, leaving config.yaml and a stage folder behind
        (
            {"vocab_size": 10**9},
            "the weights do not match {config} (hidden_size 48, intermediate_size 96, num_attention_heads 4, "
            "num_key_value_heads 2, vocab_size 1000000000): lm_head.weight in {folder}/model.safetensors is "
            "(300, 48), expected (1000000000, 48)",
        ),
        ({"rope_scaling": "garbage"}, "{config}: rope_scaling must be an object (or null), got 'garbage'"),
        (
            {"num_attention_heads": 5, "num_key_value_heads": 1},
            "{config}: num_attention_heads 5 must divide hidden_size 48",
        ),
    ],
    ids=["vocab-1e9", "rope-garbage", "heads-5"],
)
def test_init_hf_is_checked_before_anything_is_built_or_written(tmp_path, monkeypatch, capsys, change, message):
    """schedule.init_hf refuses a config.json as lwm-generate does: against its own weights' headers."""
    import json

    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "llama"
    config = LlamaConfig(
        vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, **change}))
    code, err = _main_exit(monkeypatch, capsys, tmp_path / "run", "stage_only=a", f"schedule.init_hf={folder}")
    expected = "schedule.init_hf: " + message.format(config=folder / "config.json", folder=folder)
    assert code == 2 and expected in err and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / "run").exists()


def test_a_full_disk_is_named_with_its_own_status(tmp_path, monkeypatch, capsys):
    import errno

    from lwm.disk.writes import NoSpaceLeft

    def full(cfg):
        raise NoSpaceLeft(tmp_path / "a" / "final.safetensors", OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr("lwm.train.command.run_schedule", full)
    code, err = _main_exit(monkeypatch, capsys, tmp_path, "stage_only=a")
    assert code == 3 and f"no space left on {tmp_path / 'a' / 'final.safetensors'}" in err, err[-2000:]


@pytest.mark.parametrize("damage", ["cut", "flipped"])
def test_a_damaged_previous_stage_is_refused_naming_it(tmp_path, monkeypatch, capsys, damage):
    """stage_only=b starts from a/final.safetensors: cut short (no checksum beside it, as copied from
    elsewhere) or with a flipped byte (its checksum disagrees), it is refused with exit 2 as stage b
    builds its model, before a step."""
    from lwm.disk.weights import save_weights
    from lwm.model import ModelConfig, Transformer

    final = save_weights(
        Transformer(ModelConfig.from_preset("debug")).state_dict(), tmp_path / "a" / "final.safetensors"
    )
    data = final.read_bytes()
    if damage == "cut":
        final.write_bytes(data[: len(data) // 2])
        final.with_name("final.safetensors.sha256").unlink()
    else:
        final.write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])
    code, err = _main_exit(monkeypatch, capsys, tmp_path, "stage_only=b")
    assert code == 2 and f"error: {final}" in err and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / "b" / "final.safetensors").exists() and not (tmp_path / "b" / "checkpoints").exists()


@pytest.fixture
def small_tmpfs(tmp_path):
    yield from mounted_tmpfs(tmp_path, "24m")  # one checkpoint of the debug model (13.5 MiB), not two


def test_a_disk_that_fills_during_a_checkpoint_exits_3_naming_it(small_tmpfs, monkeypatch, capsys):
    """The second checkpoint does not fit beside the first: train.py says which file, exits 3, and the
    first checkpoint is whole."""
    last = small_tmpfs / "a" / "checkpoints" / "last.ckpt"
    code, err = _main_exit(monkeypatch, capsys, small_tmpfs, "stage_only=a", "trainer.checkpoint_every=2")
    assert code == 3 and f"error: no space left on {last};" in err, err[-2000:]
    assert load_verified(last)["global_step"] == 2


def _text_source(path, bad: dict[int, str], n: int) -> list[str]:
    """n text examples, those of `bad` (index -> line) replaced; the overrides that train on them."""
    lines = [
        bad.get(i, json.dumps({"text": f"the red circle moves left and the blue square moves right {i}"}))
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    custom = ["data=custom", "data.tokenizer=data/sample/tokenizer.model"]
    return [*custom, f"data.sources={{text: {{path: {path}, fields: text}}}}", "stage_only=a"]


def test_skipped_examples_reach_the_metrics_and_the_summary(tmp_path, monkeypatch, capsys):
    """A run whose data has bad lines (one not JSON, one over data.max_line_bytes) logs data/skipped
    in metrics.csv, and its summary names the count and the first reasons; under data.strict=true the
    first bad line stops it with exit 2."""
    data = _text_source(tmp_path / "docs.jsonl", {3: "{oops", 7: json.dumps({"text": "x " * 600})}, 20)
    small = [*data, "data.max_line_bytes=1000", "schedule.stages.0.steps=3"]
    code, out, err = main_in_process(monkeypatch, capsys, tmp_path / "run", *small)
    assert code == 0, err[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "run" / "a" / "logs" / "metrics.csv")))
    skipped = [float(r["data/skipped"]) for r in rows if r.get("data/skipped")]
    assert len(skipped) == 3 and skipped[-1] >= 2 and skipped == sorted(skipped), rows
    summary = out[out.index("finished in") :]
    assert re.search(
        r"skipped +a: \d+ of the \d+ examples read \(\d+%; every epoch reads them all\); 0 vision tokens trained on; "
        r"first reasons:\n",
        summary,
    ), summary
    assert (
        "docs.jsonl:4: not JSON" in summary
        and "docs.jsonl:8: a line of 1212 bytes, longer than max_line_bytes 1000" in summary
    )
    code, out, err = main_in_process(monkeypatch, capsys, tmp_path / "strict", *small, "data.strict=true")
    assert code == 2 and re.search(r"error: .*docs\.jsonl:[48]: .*data\.strict=true", err), err[-3000:]
    assert "Traceback" not in err


def test_mostly_bad_data_stops_the_run_with_exit_2(tmp_path, monkeypatch, capsys):
    """4 of 6 examples bad: train.py stops with exit 2 naming the fraction, the counts and the first
    reasons (data.max_skipped_fraction 0.5); at 1 it trains on the two good ones."""
    data = _text_source(tmp_path / "docs.jsonl", {i: json.dumps({"txt": i}) for i in (0, 2, 3, 5)}, 6)
    code, out, err = main_in_process(monkeypatch, capsys, tmp_path / "run", *data)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert re.search(
        r"error: 4 of the \d+ examples of an epoch are skipped \(67%\), more than data.max_skipped_fraction 0.5; "
        r"first reasons: .*docs\.jsonl:\d: unknown field 'text'",
        err,
    ), err[-3000:]


def test_too_little_data_for_one_batch_exits_2_naming_the_sources(tmp_path, monkeypatch, capsys):
    """One short example cannot fill stage a's global batch of 2 sequences: exit 2 naming the source, no
    traceback (it was a bare ValueError, exit 1)."""
    data = _text_source(tmp_path / "docs.jsonl", {}, 1)
    code, out, err = main_in_process(monkeypatch, capsys, tmp_path / "run", *data)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert f"error: the sources ({tmp_path / 'docs.jsonl'}) yield fewer than one global batch" in err, err[-3000:]


def test_the_vision_count_reads_no_device_value_per_step():
    """The data report's vision tokens are summed on the device each step and read once (a checkpoint, the
    stage's end): with the GPU's batch on the meta device and under FakeTensorMode, where reading a value
    fails, every step's count goes through; reading it is the reduce at the end, exact past 2**24."""
    from types import SimpleNamespace

    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    from lwm.train.skipped import SkippedExamples

    trainer = SimpleNamespace(datamodule=None)
    meta = SkippedExamples("unused", tp=2)
    for _ in range(3):
        meta.on_train_batch_end(
            trainer, None, None, {"vision_mask": torch.ones(2, 8, dtype=torch.bool, device="meta")}, 0
        )
    assert meta.vision.device.type == "meta" and meta.vision.dtype == torch.int64
    with FakeTensorMode():
        fake = SkippedExamples("unused")
        for _ in range(3):
            fake.on_train_batch_end(trainer, None, None, {"vision_mask": torch.ones(2, 8, dtype=torch.bool)}, 0)
        with pytest.raises(DataDependentOutputException):  # a value is read only where it is meant to be: the end
            fake.vision.item()
    real = SkippedExamples("unused", tp=2)
    real.before = 5
    real.vision = torch.tensor(2**25 + 6)  # two tp ranks' count of the same slices: counted once
    strategy = SimpleNamespace(reduce=lambda t, reduce_op: t)  # one process
    module = SimpleNamespace(device=torch.device("cpu"))
    assert real._vision_tokens(SimpleNamespace(strategy=strategy), module) == 5 + 2**24 + 3


def test_a_failed_evaluation_fails_the_run_and_its_rerun_evaluates_again(tmp_path, monkeypatch, capsys):
    """The needle evaluation after training failing (its child exits 1: a trial failed) is exit 6 naming it, not
    "finished" with exit 0; the weights are kept, and the same command evaluates them again without training;
    once evaluated whole, the run is finished."""
    from lwm.train import evaluate

    run = ["stage_only=a", "schedule.stages.0.steps=1", "evaluate.lengths=[128]", "evaluate.depths=[0]"]
    run += ["evaluate.trials=1", f"evaluate.haystack={ROOT / 'data' / 'sample' / 'text.jsonl'}"]
    calls = []

    def needle_child(status: int, complete: bool):
        def run_in_child(fn, config, env=None):
            calls.append(config.out)
            out = tmp_path / "needle"
            out.mkdir(exist_ok=True)
            results = {"config": {"complete": complete}, "trials": [], "trials_failed": status}
            (out / "needle.json").write_text(json.dumps(results))
            return status

        return run_in_child

    with monkeypatch.context() as patch:
        patch.setattr(evaluate, "run_in_child", needle_child(1, True))
        code, out, err = main_in_process(patch, capsys, tmp_path, *run)
    assert code == 6 and "error: the needle evaluation failed" in err and "needle failed" in out, (out + err)[-3000:]
    final = tmp_path / "a" / "final.safetensors"
    weights = final.read_bytes()

    with monkeypatch.context() as patch:
        patch.setattr(evaluate, "run_in_child", needle_child(0, True))
        code, out, err = main_in_process(patch, capsys, tmp_path, *run)  # the same command
    assert code == 0 and "is finished" not in out and "stage a:" not in out, (out + err)[-3000:]
    assert len(calls) == 2 and final.read_bytes() == weights
    code, out, err = main_in_process(monkeypatch, capsys, tmp_path, *run)
    assert code == 0 and f"run {tmp_path} is finished" in out and len(calls) == 2, (out + err)[-3000:]
