"""Checkpoints from elsewhere run no code; checkpoints we write are atomic and verified.

Crafted files carry a pickle whose unpickling would create a marker file: the tests assert the
refusal and that the marker never appears."""

from __future__ import annotations

import json
import pathlib
import pickle
from dataclasses import asdict

import pytest
import torch

from lwm.disk.checkpoints import CheckpointError, check_sharded, load_verified, save_verified
from lwm.interop.stage_outputs import load_stage
from lwm.model import ModelConfig
from lwm.train import rng
from lwm.train.checkpointing import AtomicCheckpointIO


class Payload:
    """Unpickling this creates `marker`: what a crafted file would do with a shell command."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def stage_folder(tmp_path, checkpoint) -> pathlib.Path:
    stage = tmp_path / "stage"
    (stage / "checkpoints").mkdir(parents=True)
    (stage / "model_config.json").write_text(json.dumps(asdict(ModelConfig.from_preset("debug"))))
    torch.save(checkpoint, stage / "checkpoints" / "last.ckpt")
    return stage


def test_a_pickled_checkpoint_in_a_run_folder_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    stage = stage_folder(tmp_path, {"state_dict": {"model.w": torch.zeros(1)}, "x": Payload(marker)})
    with pytest.raises(CheckpointError, match="refusing to load .*last.ckpt.*objects other than tensors"):
        load_stage(stage)
    assert not marker.exists()


def test_random_states_are_plain_data_and_pickled_ones_are_refused(tmp_path):
    states = rng.gather_states()
    path = tmp_path / "c.ckpt"
    torch.save({"rng_states": states}, path)
    torch.manual_seed(5)
    want = torch.rand(3)
    rng.restore_own(torch.load(path, weights_only=True)["rng_states"])  # loads without pickle
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), want)
    marker = tmp_path / "ran"
    with pytest.raises(ValueError, match="random state for rank 0 is a bytes.*not unpickled"):
        rng.restore_own({"0": pickle.dumps(Payload(marker))})
    assert not marker.exists()


def test_checkpoints_are_written_beside_their_target_and_verified(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    target = tmp_path / "ckpts" / "last.ckpt"
    made = []
    real_open = open

    def spy_open(file, mode="r", *args, **kwargs):
        if "w" in mode:
            made.append(pathlib.Path(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy_open)
    io.save_checkpoint({"state_dict": {"w": torch.arange(4.0)}, "step": 3}, target)
    monkeypatch.undo()
    assert made and all(p.parent == target.parent for p in made)  # never staged in $TMPDIR
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt", "last.ckpt.sha256"]
    assert io.load_checkpoint(target)["step"] == 3
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: the zip reader would not notice
    target.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="last.ckpt does not match its checksum"):
        io.load_checkpoint(target)


def test_a_cut_short_checkpoint_names_the_file(tmp_path):
    path = tmp_path / "last.ckpt"
    torch.save({"w": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="last.ckpt is cut short or corrupted"):
        load_verified(path)


def test_sharded_checkpoint_metadata_with_code_is_refused(tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "last.ckpt"
    dcp.save({"model": {"w": torch.zeros(2)}, "step": 3, "note": {"a": [1, 2]}}, checkpoint_id=folder)
    check_sharded(folder)  # what we write passes
    marker = tmp_path / "ran"
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(CheckpointError, match="pathlib.Path.touch|is not part of a checkpoint"):
        check_sharded(folder)
    assert not marker.exists()
    crafted = tmp_path / "crafted.ckpt"  # code in a non-tensor entry, which DCP would unpickle freely
    dcp.save({"model": {"w": torch.zeros(2)}, "loops": Payload(marker)}, checkpoint_id=crafted)
    with pytest.raises(CheckpointError, match="entry 'loops' is not plain data"):
        check_sharded(crafted)
    assert not marker.exists()


def test_verified_save_refuses_nothing_it_wrote(tmp_path):
    path = tmp_path / "x.ckpt"
    save_verified({"a": torch.ones(2), "b": [1, "two", 3.0]}, path)
    assert load_verified(path)["b"] == [1, "two", 3.0]


def test_a_metrics_row_cut_by_a_kill_is_dropped_and_a_corrupted_one_named(tmp_path):
    from lwm.train.callbacks import MetricHistory

    path = tmp_path / "metrics.csv"
    path.write_text("step,train/loss,train/lr\n0,1.5,0.1\n1,1.4,0.1\n2,1.")  # killed mid-field
    assert [r["step"] for r in MetricHistory.read(path)] == ["0", "1"]
    path.write_text("step,train/loss,train/lr\n0,1.5,0.1\n1,1.4\n2,1.3,0.1\n")
    with pytest.raises(ValueError, match="metrics.csv, line 3: not a metrics row"):
        MetricHistory.read(path)


def _command_pickle(module: str, name: str, command: str, stack_global: bool) -> bytes:
    """A protocol-4 pickle that calls `module`'s attribute `name` (dotted: followed from the module)
    with `command`: os.system through a DCP module, which imports os."""

    def text(s: str) -> bytes:
        return b"\x8c" + bytes([len(s.encode())]) + s.encode()  # SHORT_BINUNICODE

    find = text(module) + text(name) + b"\x93" if stack_global else f"c{module}\n{name}\n".encode()
    return b"\x80\x04" + find + text(command) + b"\x85R."  # TUPLE1, REDUCE, STOP


@pytest.mark.parametrize("stack_global", [True, False], ids=["STACK_GLOBAL", "GLOBAL"])
@pytest.mark.parametrize("module", ["torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"])
def test_sharded_metadata_reaching_os_system_through_a_checkpoint_module_runs_nothing(tmp_path, module, stack_global):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "last.ckpt"
    dcp.save({"model": {"w": torch.zeros(2)}}, checkpoint_id=folder)
    marker = tmp_path / "ran"
    (folder / ".metadata").write_bytes(_command_pickle(module, "os.system", f"touch {marker}", stack_global))
    with pytest.raises(CheckpointError, match=rf"refusing {folder / '.metadata'}: .*os\.system"):
        check_sharded(folder)
    assert not marker.exists()


def test_sharded_metadata_refuses_whatever_is_not_a_metadata_class(tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "last.ckpt"
    dcp.save({"model": {"w": torch.zeros(2)}, "step": 3}, checkpoint_id=folder)
    meta = folder / ".metadata"
    for module, name in [
        ("torch.distributed.checkpoint.metadata", "os"),  # a module, not a class
        ("torch.distributed.checkpoint.filesystem", "shutil"),
        ("torch.distributed.checkpoint.filesystem", "FileSystemWriter"),  # a class, but no metadata
        ("torch.distributed.checkpoint.metadata", "field"),  # dataclasses.field, imported there
    ]:
        meta.write_bytes(_command_pickle(module, name, "x", stack_global=True))
        with pytest.raises(CheckpointError, match=rf"refusing {meta}: {module}\.{name} is not part"):
            check_sharded(folder)


@pytest.mark.parametrize("where", ["/etc/passwd", "../outside.distcp", "sub/../../outside.distcp"])
def test_sharded_entries_never_name_a_file_outside_the_checkpoint(tmp_path, where):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "last.ckpt"
    dcp.save({"model": {"w": torch.zeros(2)}, "step": 3}, checkpoint_id=folder)
    meta = folder / ".metadata"
    metadata = pickle.loads(meta.read_bytes())  # our own file, written just above
    for info in metadata.storage_data.values():
        info.relative_path = where
    meta.write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match=rf"refusing {folder}: entry .* names {where!r}, outside the checkpoint"):
        check_sharded(folder)


class Killed(BaseException):
    """What a SIGKILL does to the writer, short of ending the test's process."""


def _killed_after(monkeypatch, renames: int) -> None:
    """os.replace works `renames` times, then the writer is killed."""
    import os

    real, done = os.replace, []

    def replace(src, dst):
        if len(done) == renames:
            raise Killed(f"killed before renaming {src} to {dst}")
        done.append(dst)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_a_kill_at_any_rename_of_a_save_leaves_a_checkpoint_that_loads(tmp_path, monkeypatch):
    """Whichever rename the kill comes before, last.ckpt loads (the old or the new one, never
    refused), and a byte flipped in it afterwards is still refused."""
    for renames in range(4):
        path = tmp_path / str(renames) / "last.ckpt"
        save_verified({"step": 1, "w": torch.zeros(8)}, path)
        _killed_after(monkeypatch, renames)
        try:
            save_verified({"step": 2, "w": torch.ones(8)}, path)
        except Killed:
            pass
        monkeypatch.undo()
        assert load_verified(path)["step"] in (1, 2), renames
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match="last.ckpt does not match its checksum"):
            load_verified(path)
    # the first save of a stage, killed between the renames, loads too
    path = tmp_path / "first" / "last.ckpt"
    _killed_after(monkeypatch, 2)
    with pytest.raises(Killed):
        save_verified({"step": 1}, path)
    monkeypatch.undo()
    assert load_verified(path)["step"] == 1


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB filesystem of its own, to fill."""
    import subprocess

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_during_a_checkpoint_write_is_named_and_keeps_the_previous_one(small_tmpfs):
    from lwm.disk.writes import NoSpaceLeft

    path = small_tmpfs / "last.ckpt"
    save_verified({"step": 1, "w": torch.zeros(1000)}, path)
    with pytest.raises(NoSpaceLeft, match=f"no space left on {path}$"):
        save_verified({"step": 2, "w": torch.zeros(1 << 18)}, path)  # 1 MiB of weights
    assert load_verified(path)["step"] == 1
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["last.ckpt", "last.ckpt.sha256"]


def sharded_stage(tmp_path) -> pathlib.Path:
    """A stage folder whose last.ckpt is a sharded checkpoint with its SHA256SUMS, as the strategy writes."""
    import torch.distributed.checkpoint as dcp

    from lwm.disk.checkpoints import sha256, write_sums

    stage = tmp_path / "stage"
    last = stage / "checkpoints" / "last.ckpt"
    (stage / "model_config.json").parent.mkdir(parents=True)
    (stage / "model_config.json").write_text(json.dumps(asdict(ModelConfig.from_preset("debug"))))
    dcp.save({"state_dict": {"model.w": torch.arange(64.0)}, "global_step": 3}, checkpoint_id=last)
    write_sums({f.name: sha256(f) for f in last.iterdir()}, last / "SHA256SUMS")
    return stage


def test_a_sharded_checkpoint_read_as_weights_is_verified(tmp_path):
    from lwm.interop.stage_outputs import checkpoint_weights

    last = sharded_stage(tmp_path) / "checkpoints" / "last.ckpt"
    assert torch.equal(checkpoint_weights(last)["w"], torch.arange(64.0))
    (shard,) = last.glob("*.distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{last}: \['{shard.name}'\] do not match {last / 'SHA256SUMS'}"):
        checkpoint_weights(last)


@pytest.mark.parametrize("name", ["../../secret", "/etc/passwd"])
def test_checksum_lists_never_name_a_file_outside_their_folder(tmp_path, name):
    from lwm.disk.checkpoints import verify_folder

    last = sharded_stage(tmp_path) / "checkpoints" / "last.ckpt"
    (last / "SHA256SUMS").write_text(f"{'0' * 64}  {name}\n")
    with pytest.raises(CheckpointError, match=rf"SHA256SUMS: {name!r} names a file outside {last}"):
        verify_folder(last)


def test_a_resume_refuses_a_sharded_checkpoint_whose_shard_changed(tmp_path, monkeypatch):
    """The strategy's load (a stage's resume): a flipped byte in a shard is refused naming it, on
    every rank alike, before torch.distributed.checkpoint reads anything."""
    last = sharded_stage(tmp_path) / "checkpoints" / "last.ckpt"
    (shard,) = last.glob("*.distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, *args, **kwargs: None)  # one rank
    with pytest.raises(CheckpointError, match=rf"{last}: \['{shard.name}'\] do not match"):
        one_rank_strategy().load_checkpoint(last)


def one_rank_strategy():
    """AtomicModelParallelStrategy's own save and load logic, without a process group."""
    from lwm.train.checkpointing import AtomicModelParallelStrategy

    class OneRank(AtomicModelParallelStrategy):
        global_rank, world_size, root_device = 0, 1, torch.device("cpu")

        def __init__(self):
            pass

        def broadcast(self, obj, src=0):
            return obj

        def barrier(self, *args, **kwargs):
            pass

    return OneRank()


def test_a_full_disk_during_a_sharded_checkpoint_write_is_named_and_keeps_the_previous_one(small_tmpfs, monkeypatch):
    """torch.distributed.checkpoint's save on a full filesystem: its CheckpointException (every rank's
    failures) becomes NoSpaceLeft naming the checkpoint, the staging folder is removed, the previous
    checkpoint stays."""
    import torch.distributed.checkpoint as dcp
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lwm.disk.writes import NoSpaceLeft

    def dcp_save(self, checkpoint, filepath, storage_options=None):
        dcp.save(checkpoint, checkpoint_id=filepath, no_dist=True)

    monkeypatch.setattr(ModelParallelStrategy, "save_checkpoint", dcp_save)
    monkeypatch.setattr(torch.distributed, "all_gather_object", lambda out, obj: out.__setitem__(0, obj))  # one rank
    path = small_tmpfs / "last.ckpt"
    one_rank_strategy().save_checkpoint({"w": torch.zeros(1000)}, path)
    with pytest.raises(NoSpaceLeft, match=f"no space left on {path}$"):
        one_rank_strategy().save_checkpoint({"w": torch.zeros(1 << 18)}, path)  # 1 MiB of weights
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["last.ckpt"]
    assert torch.equal(_dcp_load(path)["w"], torch.zeros(1000))


def _dcp_load(path: pathlib.Path) -> dict:
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.empty(1000)}
    dcp.load(state, checkpoint_id=path, no_dist=True)
    return state
