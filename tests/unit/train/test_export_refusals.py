"""python -m lwm.train.export refuses bad input with exit 2 and a message naming it, before any work;
the one weights reader names a file that is not weights."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch

from lwm.disk.weights import read_weights, save_weights
from lwm.model import ModelConfig, Transformer
from lwm.train.export import main


@pytest.fixture
def stage(tmp_path):
    folder = tmp_path / "a"
    cfg = ModelConfig.from_preset("debug")
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "model_config.json").write_text(json.dumps(asdict(cfg)))
    save_weights(Transformer(cfg).state_dict(), folder / "final.safetensors")
    return folder


def refusal(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err, err
    return err


def test_export_refuses_bad_input(stage, tmp_path, capsys):
    out = tmp_path / "hf"
    (tmp_path / "file").write_text("x")
    assert "is a file; name a folder" in refusal([stage, "--out", tmp_path / "file"], capsys)
    (tmp_path / "tok.model").write_text("not a model")
    assert "tok.model is not a sentencepiece model" in refusal(
        [stage, "--out", out, "--tokenizer", tmp_path / "tok.model"], capsys
    )
    (stage / "model_config.json").write_text("{not json")
    assert "model_config.json is not valid JSON" in refusal([stage, "--out", out], capsys)
    (stage / "model_config.json").write_text(json.dumps({**asdict(ModelConfig.from_preset("debug")), "n_heads": 0}))
    assert "n_heads must be a positive integer, got 0" in refusal([stage, "--out", out], capsys)
    (stage / "model_config.json").write_text(json.dumps(asdict(ModelConfig.from_preset("debug", dim=128))))
    assert "final.safetensors do not fit the stage's model_config.json" in refusal([stage, "--out", out], capsys)
    (stage / "model_config.json").unlink()
    assert "model_config.json" in refusal([stage, "--out", out], capsys)
    assert not out.exists()


def test_weights_that_are_not_weights_are_named(tmp_path):
    bad = tmp_path / "w.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(ValueError, match="w.safetensors is not a readable safetensors file"):
        read_weights(bad)
    pt = tmp_path / "w.pt"
    pt.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="w.pt is not a weights file"):
        read_weights(pt)
    torch.save({"w": torch.zeros(100)}, pt)
    pt.write_bytes(pt.read_bytes()[:200])
    with pytest.raises(ValueError, match="w.pt is cut short or corrupted"):
        read_weights(pt)


# Leading bytes that each make torch's unpickler fail in its own way (IndexError, KeyError, struct.error)
JUNK = [b"(junk", b"tea", b"e\x9a\x8f", b"hello", b"j\x01h", b"G", b"M", b"\x80\x02R\xaf", b"\x86", b"}x"]


@pytest.mark.parametrize("junk", JUNK, ids=repr)
def test_junk_bytes_are_named_as_not_weights(tmp_path, junk):
    from lwm.disk.checkpoints import CheckpointError, load_verified

    path = tmp_path / "w.pt"
    path.write_bytes(junk + b"\n")
    with pytest.raises(ValueError, match=r"w.pt is not a weights file|w.pt is cut short or corrupted"):
        read_weights(path)
    with pytest.raises(CheckpointError, match=r"w.pt is cut short or corrupted|refusing to load .*w.pt"):
        load_verified(path)


def test_a_vqgan_that_is_not_one_is_refused_before_anything_is_written(stage, tmp_path, capsys):
    out = tmp_path / "hf"
    text = tmp_path / "notes.txt"
    text.write_text("these are notes, not a VQGAN\n")
    assert "notes.txt" in refusal([stage, "--out", out, "--vqgan", text], capsys)
    junk = tmp_path / "v.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    assert "v.safetensors is not a readable safetensors file" in refusal([stage, "--out", out, "--vqgan", junk], capsys)
    wrong = tmp_path / "wrong.safetensors"
    save_weights({"w": torch.zeros(2)}, wrong)
    assert "wrong.safetensors does not fit" in refusal([stage, "--out", out, "--vqgan", wrong], capsys)
    assert not out.exists()


def test_weights_are_written_with_a_checksum_and_verified_on_read(tmp_path):
    from lwm.disk.checkpoints import CheckpointError

    path = save_weights({"w": torch.arange(64.0)}, tmp_path / "a" / "final.safetensors")
    assert sorted(p.name for p in path.parent.iterdir()) == ["final.safetensors", "final.safetensors.sha256"]
    assert torch.equal(read_weights(path)["w"], torch.arange(64.0))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01  # inside the tensor's bytes: safetensors itself would read it
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"final.safetensors does not match its checksum in .*\.sha256"):
        read_weights(path)


# ------------------------------------------------------------------------ --out: only its own files


def exported(stage, out, capsys, *extra) -> dict[str, bytes]:
    """Export `stage` into `out` (exit 0); the folder's files and their bytes."""
    assert main([str(stage), "--out", str(out), *map(str, extra)]) == 0, capsys.readouterr().err
    return contents(out)


def contents(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_export_refuses_an_out_holding_files_it_did_not_make(stage, tmp_path, capsys):
    """huggingface_hub's save_torch_state_dict deleted any model-*-of-*.safetensors and index there."""
    out = tmp_path / "hf"
    out.mkdir()
    theirs = {
        "model-00001-of-00003.safetensors": b"someone else's shard",
        "model.safetensors.index.json": b'{"weight_map": {}}',
        "notes/readme.txt": b"notes",
    }
    for name, data in theirs.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    err = refusal([stage, "--out", out], capsys)
    assert (
        f"export: --out {out} holds files an export did not make (model-00001-of-00003.safetensors, "
        "model.safetensors.index.json, notes/readme.txt); an export writes into an empty or new folder" in err
    ), err
    assert contents(out) == theirs and sorted(p.name for p in tmp_path.iterdir()) == ["a", "hf"]  # nothing staged


def test_export_never_writes_through_a_symlink(stage, tmp_path, capsys):
    """--out linked to another run's hf/ replaced its weights and left its tokenizer: a stale mix."""
    other = tmp_path / "other"
    before = exported(stage, other / "hf", capsys)
    (tmp_path / "link").symlink_to(other / "hf")
    err = refusal([stage, "--out", tmp_path / "link"], capsys)
    assert f"--out {tmp_path / 'link'} is a symlink to {other / 'hf'}; an export writes only into a real folder" in err
    (tmp_path / "runs").symlink_to(other)
    err = refusal([stage, "--out", tmp_path / "runs" / "hf"], capsys)
    assert f"is reached through the symlink {tmp_path / 'runs'}, which points to {other}" in err, err
    assert contents(other / "hf") == before


def test_export_replaces_its_own_earlier_export_exactly(stage, tmp_path, capsys):
    from lwm.disk.writes import OWN_FILES
    from lwm.paths import TINY_VQGAN

    out = tmp_path / "hf"
    first = exported(stage, out, capsys, "--vqgan", TINY_VQGAN)
    assert {"vqgan/config.json", "lwm.json", "config.json", OWN_FILES} <= set(first)
    again = exported(stage, out, capsys)  # the same run again, without its VQGAN: vqgan/ and lwm.json go
    assert set(again) == set(json.loads(again[OWN_FILES])["files"]) | {OWN_FILES}
    assert not (out / "vqgan").exists() and "lwm.json" not in again and again["config.json"] == first["config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "hf"]  # the staging folder is gone
    (out / "extra.txt").write_text("mine")  # a file added since: the folder is no longer only the export's
    assert "holds files an export did not make (extra.txt)" in refusal([stage, "--out", out], capsys)
