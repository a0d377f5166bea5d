"""lwm-tokenize claims its --out folder for one set of settings, atomically across shards: a shard started
with other settings while the first runs is refused (exit 2) naming the folder and the settings."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from pathlib import Path

import pytest

from lwm.video.tokenize import SETTINGS, OutputDir, TokenizeConfig, main, validate


def shard_config(video: Path, out: Path, shard: tuple[int, int], **rate) -> TokenizeConfig:
    return TokenizeConfig(inputs=[str(video)], out=out, vqgan="tiny", device="cpu", shard=shard, **rate)


def test_a_shard_with_other_settings_is_refused_while_the_first_runs(tmp_path, capsys):
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"")  # never read: the folder is claimed before any video is
    out = tmp_path / "out"
    with ExitStack() as held:  # shard 0 of 2 has claimed the folder and runs (holds its lock)
        validate(shard_config(video, out, (0, 2), fps=4.0), held)
        argv = [str(video), "--out", str(out), "--vqgan", "tiny", "--device", "cpu", "--shard", "1/2"]
        with pytest.raises(SystemExit) as info:
            main([*argv, "--max-frames", "2"])
        err = capsys.readouterr().err
        assert info.value.code == 2, err
        assert f"--out {out} is claimed for other settings" in err
        assert "fps 4.0 -> None" in err and "max_frames None -> 2" in err
        assert not (out / "failures.1-of-2.jsonl").exists()  # the refused shard wrote nothing of its own
        assert (out / SETTINGS).is_file()
        with ExitStack() as second:  # the same settings join the folder
            assert validate(shard_config(video, out, (1, 2), fps=4.0), second).shard == (1, 2)


def test_the_claim_is_atomic(tmp_path):
    """Shards racing to claim one folder: exactly one set of settings wins, every other set is told so."""
    out = OutputDir(tmp_path / "out", (0, 1))
    settings = [{"sampling": {"fps": None, "max_frames": n}, "tokenizer": {"weights": "w"}} for n in (1, 2) * 8]
    results: list = [None] * len(settings)
    start = threading.Barrier(len(settings))

    def claim(i: int) -> None:
        start.wait()
        results[i] = out.claim(settings[i])

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(settings))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [s for s, r in zip(settings, results) if r is None]
    assert won and all(s == won[0] for s in won) and len(won) == len(settings) // 2
    assert all(r == won[0] for r in results if r is not None)
    assert not list(out.root.glob(".settings.json.*"))  # no temporary file left
