"""Folders that are not a run's are left alone: trainer.overwrite=true removes only what a run of this
project wrote (its config.yaml says so), and a trainer.out_dir that is a symlink is resolved, said, and
refused where it leads to files no run wrote. train.py's main runs in this process."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from train_runs import main_in_process

SHORT = ["stage_only=a", "schedule.stages.0.steps=1"]


def main(monkeypatch, capsys, out, *overrides) -> tuple[int, str]:
    code, stdout, stderr = main_in_process(monkeypatch, capsys, out, *overrides)
    return code, stdout + stderr


def foreign(folder: Path) -> dict[str, bytes]:
    """A folder of someone's files, named like a run's outputs (stage a, hf/, needle/) and not; returns them."""
    files = {"a/final.safetensors": b"theirs", "hf/model.safetensors": b"theirs", "needle/grid.json": b"{}"}
    files["notes.txt"] = b"mine"
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return files


def untouched(folder: Path, files: dict[str, bytes]) -> bool:
    found = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    return found == files


def test_overwrite_refuses_a_folder_that_holds_no_run(tmp_path, monkeypatch, capsys):
    files = foreign(tmp_path)
    code, text = main(monkeypatch, capsys, tmp_path, *SHORT, "trainer.overwrite=true")
    assert code == 2 and "Traceback" not in text, text[-3000:]
    assert f"trainer.out_dir {tmp_path} holds no run (no config.yaml): a/, hf/, needle/, notes.txt" in text, text
    assert untouched(tmp_path, files)  # nothing removed, no config.yaml written


def test_overwrite_takes_an_empty_folder_and_clears_only_a_run(tmp_path):
    from lwm.disk.run_folder import check, clear

    (tmp_path / "train.lock").write_text("{}")  # the run's own lock, held while check runs again
    assert check(tmp_path, {}, overwrite=True) is False
    assert clear(tmp_path, ["a"]) == [] and [p.name for p in tmp_path.iterdir()] == ["train.lock"]
    (tmp_path / "train.lock").unlink()
    files = foreign(tmp_path)
    assert clear(tmp_path, ["a"]) == [] and untouched(tmp_path, files)


def test_a_symlinked_out_dir_into_someone_elses_files_is_refused(tmp_path, monkeypatch, capsys):
    target = tmp_path / "theirs"
    target.mkdir()
    files = foreign(target)
    link = tmp_path / "run"
    link.symlink_to(target)
    code, text = main(monkeypatch, capsys, link, *SHORT)
    assert code == 2 and "Traceback" not in text, text[-3000:]
    assert f"trainer.out_dir {link} is a symlink to {target}, which holds files no run of this project wrote" in text
    assert "a/, hf/, needle/, notes.txt" in text, text[-3000:]
    assert untouched(target, files)


def test_a_symlinked_out_dir_is_resolved_and_said(tmp_path, monkeypatch, capsys):
    """A link to a new folder: the run writes there and says so (config.yaml records the folder itself); a
    second link to that run with another config is refused as another run, naming the folder's config.yaml."""
    target = tmp_path / "real"
    link = tmp_path / "run"
    link.symlink_to(target)
    code, text = main(monkeypatch, capsys, link, *SHORT)
    assert code == 0 and f"trainer.out_dir {link} leads to {target} (symlinks resolved)" in text, text[-3000:]
    assert (target / "a" / "final.safetensors").is_file()
    assert OmegaConf.load(target / "config.yaml").trainer.out_dir == str(target)
    other = tmp_path / "other"
    other.symlink_to(target)
    code, text = main(monkeypatch, capsys, other, *SHORT, "trainer.seed=1")
    assert code == 2 and f"trainer.out_dir {target} holds another run ({target / 'config.yaml'})" in text, text


def test_a_loop_of_symlinks_is_refused_naming_it(tmp_path):
    import pytest

    from lwm.disk.run_folder import OtherRun, resolved

    (tmp_path / "x").symlink_to(tmp_path / "y")
    (tmp_path / "y").symlink_to(tmp_path / "x")
    with pytest.raises(OtherRun, match=f"trainer.out_dir {tmp_path / 'x'} is a loop of symlinks"):
        resolved(tmp_path / "x")
    assert resolved(tmp_path / "new") == (tmp_path / "new", None)  # no link: as given, nothing said
