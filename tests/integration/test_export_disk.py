"""An export into a full disk exits 3 naming its folder, as training's own full disk does, and leaves it as
it was; a run whose export failed so exports on its rerun. The full disk is safetensors' writer failing as
it does on one (measured on a 1 MiB tmpfs: "Error while serializing: I/O error: No space left on device
(os error 28)", a SafetensorError, no OSError), and a real tmpfs where this process may mount one."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict

import pytest
from safetensors import SafetensorError
from train_runs import main_in_process

from lwm.disk.weights import save_weights
from lwm.model import ModelConfig, Transformer
from lwm.train.export import main as export_main

FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


def full_disk(*args, **kwargs):
    raise SafetensorError(FULL)


@pytest.fixture
def stage(tmp_path):
    folder = tmp_path / "a"
    cfg = ModelConfig.from_preset("debug")
    folder.mkdir()
    (folder / "model_config.json").write_text(json.dumps(asdict(cfg)))
    save_weights(Transformer(cfg).state_dict(), folder / "final.safetensors")
    return folder


def exported(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        export_main([str(a) for a in argv])
    return exit_.value.code, capsys.readouterr().err


def test_the_export_command_into_a_full_disk_exits_3_naming_its_folder(stage, tmp_path, monkeypatch, capsys):
    out = tmp_path / "hf"
    monkeypatch.setattr("huggingface_hub.save_torch_state_dict", full_disk)
    code, err = exported([stage, "--out", out], capsys)
    assert code == 3 and f"export: no space left on {out}; free space and run the export again" in err, err
    assert "Traceback" not in err and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no half-made folder beside it


def test_the_export_command_into_a_real_full_tmpfs_exits_3(stage, tmp_path, capsys):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        code, err = exported([stage, "--out", mnt / "hf"], capsys)  # 6.7 MB of weights
        assert code == 3 and f"export: no space left on {mnt / 'hf'};" in err, err
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_run_whose_export_failed_exports_on_its_rerun(tmp_path, monkeypatch, capsys):
    run = ["stage_only=a", "schedule.stages.0.steps=1", "export=true"]
    with monkeypatch.context() as patch:
        patch.setattr("huggingface_hub.save_torch_state_dict", full_disk)
        code, out, err = main_in_process(patch, capsys, tmp_path, *run)
    assert code == 3 and f"error: no space left on {tmp_path / 'hf'}; free space and rerun" in err, err[-3000:]
    assert "Traceback" not in err and not (tmp_path / "hf").exists()
    final = tmp_path / "a" / "final.safetensors"
    weights = final.read_bytes()

    code, out, err = main_in_process(monkeypatch, capsys, tmp_path, *run)  # the same command, the disk freed
    assert code == 0 and "is finished" not in out and "stage a:" not in out, (out + err)[-3000:]
    assert (tmp_path / "hf" / "config.json").is_file() and final.read_bytes() == weights
    code, out, err = main_in_process(monkeypatch, capsys, tmp_path, *run)
    assert code == 0 and f"run {tmp_path} is finished" in out, (out + err)[-3000:]
