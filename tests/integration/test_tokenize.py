"""lwm-tokenize end to end on small videos with the tiny VQGAN (random weights, 64x64 frames)."""

import errno
import hashlib
import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch
from deps import skip_module_without_decord

skip_module_without_decord()
import decord  # noqa: E402, F401
from video_samples import make_bad, make_good  # noqa: E402

from lwm.paths import REPO  # noqa: E402
from lwm.video.reader import read_video  # noqa: E402
from lwm.video.tokenize import TokenizeConfig, collect_videos, main, validate, video_id  # noqa: E402
from lwm.vision.checkpoint import weights_hash  # noqa: E402
from lwm.vision.vqgan import VQGAN, VQGANConfig  # noqa: E402

ROOT = REPO
BATCH = 3  # run's --batch-size


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenize")
    good = make_good(root / "videos")
    bad = make_bad(root / "bad", good["landscape_mp4"])
    missing = root / "missing.mp4"
    # A list file: relative paths, a comment, a duplicate of a video the folder also gives, a missing path.
    listing = root / "bad" / "list.txt"
    listing.write_text(
        "# bad inputs\n" + "".join(f"{p.name}\n" for p in bad.values()) + "\n../videos/portrait.mp4\n../missing.mp4\n"
    )
    torch.manual_seed(123)
    model = VQGAN(VQGANConfig.from_preset("tiny")).eval()
    checkpoint = root / "tiny.pt"
    torch.save(model.state_dict(), checkpoint)
    return dict(root=root, good=good, bad=bad, missing=missing, listing=listing, model=model, checkpoint=checkpoint)


def run(data, out, *extra, inputs=None):
    inputs = [str(data["root"] / "videos"), str(data["listing"])] if inputs is None else inputs
    argv = [
        *inputs,
        "--out",
        str(out),
        "--vqgan",
        "tiny",
        "--checkpoint",
        str(data["checkpoint"]),
        "--batch-size",
        str(BATCH),
        "--device",
        "cpu",
        *extra,
    ]
    return main(argv)


def records(out, pattern):
    return [
        json.loads(line)
        for path in sorted(Path(out).glob(pattern))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def expected_codes(data, source, **sampling):
    """The VQGAN's codes of the frames, encoded in run's batches: its matmuls are not batch-invariant, so
    a near tie between two codes can fall either way in a batch of another size (1 code in 1024 seen)."""
    frames, timestamps = read_video(source, resolution=64, **sampling)
    return data["model"].encode(frames, batch_size=BATCH).numpy(), timestamps


def test_tokenize_folder_and_list(data, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(data, out) == 1  # some inputs are bad
    summary = capsys.readouterr().out
    manifest = records(out, "manifest.jsonl")
    failures = records(out, "failures.jsonl")
    assert sorted(r["source"] for r in manifest) == sorted(str(p) for p in data["good"].values())
    assert sorted(r["source"] for r in failures) == sorted([*map(str, data["bad"].values()), str(data["missing"])])
    assert f"{len(manifest)} done" in summary and f"{len(failures)} failed" in summary and "0 skipped" in summary

    # Every bad input has its own clear line; the run went on and finished the good videos.
    errors = {Path(r["source"]).name: r["error"] for r in failures}
    assert "no such file" in errors["missing.mp4"]
    assert "cannot open as a video" in errors["text.mp4"]
    assert "cannot open as a video" in errors["truncated.mp4"]
    assert "(corrupt or truncated file?)" in errors["corrupt.mp4"]  # opens, fails to decode (opening or streaming)
    assert "no video stream, or no frames" in errors["zero.mp4"]
    assert "shorter than one sampling interval" in errors["short.mp4"]
    assert all(r["source"] in r["error"] for r in failures)

    assert len({r["id"] for r in manifest}) == len(manifest)  # landscape.mp4 and landscape.mkv: one stem, two ids
    for record in manifest:
        assert record["id"] == video_id(record["source"])
        tokens = np.load(out / record["tokens"])
        assert record["sha256"] == hashlib.sha256((out / record["tokens"]).read_bytes()).hexdigest()
        assert tokens.dtype == np.uint16 and tokens.shape == (record["frames"], 256) == tuple(record["shape"])
        codes, timestamps = expected_codes(data, record["source"], fps=1.0)
        np.testing.assert_array_equal(tokens, codes)
        np.testing.assert_allclose(record["timestamps"], timestamps, atol=1e-6)
        assert record["sampling"] == {"fps": 1.0, "max_frames": None, "start": None, "end": None}
        assert record["tokenizer"] == {
            "preset": "tiny",
            "checkpoint": str(data["checkpoint"]),
            "weights": weights_hash(data["model"]),
        }
    vfr = next(r for r in manifest if r["source"].endswith("vfr.mp4"))
    np.testing.assert_allclose(vfr["timestamps"], [0.0, 1.0, 1.2], atol=1e-3)
    assert not list((out / "tokens").glob("*.tmp"))


def test_max_frames_start_end(data, tmp_path):
    out = tmp_path / "out"
    source = data["good"]["landscape_mkv"]
    assert run(data, out, "--max-frames", "4", "--start", "1", "--end", "3", inputs=[str(source)]) == 0
    [record] = records(out, "manifest.jsonl")
    assert record["sampling"] == {"fps": None, "max_frames": 4, "start": 1.0, "end": 3.0}
    codes, timestamps = expected_codes(data, source, max_frames=4, start=1.0, end=3.0)
    np.testing.assert_array_equal(np.load(out / record["tokens"]), codes)
    np.testing.assert_allclose(record["timestamps"], [1.0, 1.6, 2.3, 2.9], atol=1e-3)


def test_resume_skips_finished_and_survives_a_kill(data, tmp_path, capsys):
    out = tmp_path / "out"
    inputs = [str(data["root"] / "videos")]
    assert run(data, out, inputs=inputs) == 0
    n = len(data["good"])
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "tokens").iterdir()}
    capsys.readouterr()

    assert run(data, out, inputs=inputs) == 0
    assert f"{n} videos: 0 done (0 frames" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in (out / "tokens").iterdir()} == mtimes

    # A kill while writing one video: its manifest line never came, a partial .npy and a temp file are
    # left, and the manifest ends in half a line.
    victim = data["good"]["portrait"]
    vid = video_id(str(victim))
    manifest = out / "manifest.jsonl"
    lines = [line for line in manifest.read_text().splitlines() if json.loads(line)["id"] != vid]
    manifest.write_text("\n".join(lines) + '\n{"id": "half a li')
    (out / "tokens" / f"{vid}.npy").write_bytes(b"\x93NUMPY partial")
    (out / "tokens" / f"{vid}.npy.tmp").write_bytes(b"garbage")

    assert run(data, out, inputs=inputs) == 0
    summary = capsys.readouterr().out
    assert f"{n} videos: 1 done" in summary and f"{n - 1} skipped" in summary
    codes, _ = expected_codes(data, victim, fps=1.0)
    np.testing.assert_array_equal(np.load(out / "tokens" / f"{vid}.npy"), codes)
    assert not (out / "tokens" / f"{vid}.npy.tmp").exists()
    text = manifest.read_text().splitlines()
    assert text[-2] == '{"id": "half a li'  # the broken line stays broken; the new record starts a fresh line
    assert json.loads(text[-1])["id"] == vid
    # A rerun after that: all finished.
    capsys.readouterr()
    assert run(data, out, inputs=inputs) == 0
    assert "0 done (0 frames" in capsys.readouterr().out


def test_resume_output_counts(data, tmp_path, capsys):
    out = tmp_path / "out"
    inputs = [str(data["good"]["landscape_mp4"]), str(data["good"]["portrait"])]
    assert run(data, out, inputs=inputs[:1]) == 0
    capsys.readouterr()
    assert run(data, out, inputs=inputs) == 0
    summary = capsys.readouterr().out
    assert "2 videos: 1 done" in summary and "1 skipped" in summary and "0 failed" in summary


def test_shards_split_without_overlap(data, tmp_path, capsys):
    out = tmp_path / "out"
    n = 3
    codes = [run(data, out, "--shard", f"{i}/{n}") for i in range(n)]
    everything = collect_videos([str(data["root"] / "videos"), str(data["listing"])])
    seen = []
    for i in range(n):
        mine = {r["source"] for r in records(out, f"manifest.{i}-of-{n}.jsonl")} | {
            r["source"] for r in records(out, f"failures.{i}-of-{n}.jsonl")
        }
        assert mine == set(everything[i::n])
        assert codes[i] == (1 if records(out, f"failures.{i}-of-{n}.jsonl") else 0)
        seen += sorted(mine)
    assert sorted(seen) == everything  # no overlap, nothing left out
    assert not (out / "manifest.jsonl").exists()
    # A later unsharded run reads every worker's manifest: only the failures are tried again.
    capsys.readouterr()
    assert run(data, out) == 1
    summary = capsys.readouterr().out
    assert "0 done (0 frames" in summary and f"{len(data['good'])} skipped" in summary


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--fps", "1", "--max-frames", "4"], "not allowed with argument"),
        (["--shard", "3/3"], "i=3, n=3"),
        (["--shard", "1/0"], "i=1, n=0"),
        (["--shard", "a/b"], "'a/b'"),
        (["--batch-size", "0"], "expected a positive integer, got '0'"),
        (["--fps", "-1"], "expected a positive number, got '-1'"),
        (["--start", "2", "--end", "1"], "end 1.0 s must be after start 2.0 s"),
        (["--vqgan", "nope"], "'nope' is neither a folder nor a preset"),
    ],
)
def test_usage_errors_exit_2(data, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as info:
        main([str(data["good"]["portrait"]), "--out", str(tmp_path / "out"), "--vqgan", "tiny", *extra])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_checkpoint_and_other_settings_exit_2(data, tmp_path, capsys):
    out = tmp_path / "out"
    source = [str(data["good"]["portrait"])]
    with pytest.raises(SystemExit) as info:
        main([*source, "--out", str(out), "--vqgan", "tiny", "--checkpoint", str(tmp_path / "none.pt")])
    assert info.value.code == 2 and "none.pt not found" in capsys.readouterr().err
    assert run(data, out, inputs=source) == 0
    with pytest.raises(SystemExit) as info:  # resuming with another rate would mix two samplings in one folder
        run(data, out, "--fps", "2", inputs=source)
    assert info.value.code == 2 and "other settings" in capsys.readouterr().err


def test_tokenizer_is_not_a_vqgan_option(data, tmp_path, capsys):
    """--tokenizer names a text tokenizer in every command; lwm-tokenize's VQGAN is --vqgan."""
    with pytest.raises(SystemExit) as info:
        main([str(data["good"]["portrait"]), "--out", str(tmp_path / "o"), "--tokenizer", "tiny"])
    assert info.value.code == 2 and "unrecognized arguments: --tokenizer" in capsys.readouterr().err


def test_diffusers_folder(data, tmp_path):
    import diffusers  # noqa: F401

    from lwm.interop.diffusers import to_diffusers

    folder = tmp_path / "vqmodel"
    to_diffusers(data["model"]).save_pretrained(folder)
    out = tmp_path / "out"
    source = data["good"]["portrait"]
    assert main([str(source), "--out", str(out), "--vqgan", str(folder), "--device", "cpu"]) == 0
    [record] = records(out, "manifest.jsonl")
    assert record["tokenizer"] == {"diffusers": str(folder), "weights": record["tokenizer"]["weights"]}
    codes, _ = expected_codes(data, source, fps=1.0)
    np.testing.assert_array_equal(np.load(out / record["tokens"]), codes)


def test_module_entry_point(data, tmp_path):
    out = tmp_path / "out"
    inputs = [str(data["good"]["tiny"]), str(data["bad"]["text"]), str(data["bad"]["corrupt"])]
    cmd = [
        sys.executable,
        "-m",
        "lwm.video.tokenize",
        *inputs,
        "--out",
        str(out),
        "--vqgan",
        "tiny",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "1 done" in result.stdout and "2 failed" in result.stdout
    assert "random weights" in result.stderr
    assert sorted(r["source"] for r in records(out, "failures.jsonl")) == sorted(inputs[1:])
    # The failures are reported once, by us; decord's C++ ('[12:34:56] .../video_reader.cc:83: ERROR opening') and
    # ffmpeg ('[h264 @ 0x...] ...') write nothing into the progress bar's stream.
    assert sum(line.startswith("failed: ") for line in result.stdout.splitlines()) == 2, result.stdout
    assert ".cc:" not in result.stderr and " @ 0x" not in result.stderr, result.stderr


def test_stem_ids_and_clashes(tmp_path):
    from lwm.video.tokenize import check_unique_ids

    a, b = tmp_path / "x" / "clip_0001.mp4", tmp_path / "y" / "clip_0001.mp4"
    assert video_id(str(a), "stem") == "clip_0001"
    assert video_id(str(a), "hashed") != video_id(str(b), "hashed")
    clash = check_unique_ids([str(a), str(b)], "stem")
    assert "both get the id 'clip_0001'" in clash and "--ids hashed" in clash
    assert check_unique_ids([str(a), str(b)], "hashed") is None


def test_a_second_run_on_the_folder_is_refused(data, tmp_path, capsys):
    """Two runs on one --out would do every video twice: the second is refused naming the first, and
    writes nothing."""
    from lwm.disk.folder_lock import output_lock

    out, source = tmp_path / "out", [str(data["good"]["tiny"])]
    with output_lock(out, "lwm-tokenize"):
        with pytest.raises(SystemExit) as info:
            run(data, out, inputs=source)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert f"--out: {out} is in use by another run (pid {os.getpid()} on " in err and "command: " in err
        assert not (out / "manifest.jsonl").exists() and not (out / "failures.jsonl").exists()
        assert run(data, out, "--shard", "0/2", inputs=source) == 0  # shards work side by side
    assert run(data, out, inputs=source) == 0  # released: the folder is free again
    assert not (out / "lwm-tokenize.lock").exists()


def fake_full_disk(f, codes):
    f.write(b"\x93NUMPY")  # a write that got some bytes out before the disk filled
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_stops_the_run_with_exit_3(data, tmp_path, capsys, monkeypatch):
    """No space left: said with the file's path, exit 3, no temp file, no video recorded as failed; what
    was done before stays, and a rerun with space resumes."""
    out, inputs = tmp_path / "out", [str(data["good"]["portrait"]), str(data["good"]["tiny"])]
    assert run(data, out, inputs=inputs[:1]) == 0
    capsys.readouterr()
    monkeypatch.setattr(np, "save", fake_full_disk)
    assert run(data, out, inputs=inputs) == 3
    err = capsys.readouterr().err
    vid = video_id(inputs[1])
    assert f"no space left on {out / 'tokens' / vid}.npy: stopped with 0 done, 1 skipped, 0 failed" in err
    assert not list((out / "tokens").glob("*.tmp")) and not records(out, "failures.jsonl")
    assert [r["source"] for r in records(out, "manifest.jsonl")] == inputs[:1]
    monkeypatch.undo()
    assert run(data, out, inputs=inputs) == 0
    assert sorted(r["source"] for r in records(out, "manifest.jsonl")) == sorted(inputs)


def test_a_full_tmpfs(data, tmp_path, capsys):
    """The same on a real full filesystem: a tmpfs filled up before the run writes its codes."""
    mount = tmp_path / "small"
    mount.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    except FileNotFoundError:
        pytest.skip("no mount command here")
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {mounted.stderr.decode().strip()}")
    try:
        out = mount / "out"
        source = data["good"]["portrait"]
        with ExitStack() as held:  # the folder claimed for the run's settings (settings.json) while there is room
            config = dict(vqgan="tiny", checkpoint=data["checkpoint"], batch_size=BATCH, device="cpu")
            validate(TokenizeConfig(inputs=[str(source)], out=out, **config), held)
        (out / "lwm-tokenize.lock").write_text("{}")  # a page the lock's record reuses
        with open(mount / "filler", "wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"\0" * 4096)
        assert run(data, out, inputs=[str(source)]) == 3
        assert "no space left on " in capsys.readouterr().err
        assert not list((out / "tokens").iterdir()) and not records(out, "failures.jsonl")
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_run_takes_the_config_the_command_line_gives(data, tmp_path, capsys):
    """lwm-tokenize is TokenizeConfig plus run(config): a config built in code is the parsed one, and run
    writes what main does; a bad option is a UsageError (main turns it into argparse's exit 2)."""
    from lwm.arg_types import from_args
    from lwm.video.tokenize import TokenizeConfig, UsageError, build_parser
    from lwm.video.tokenize import run as run_config

    video = str(data["good"]["portrait"])
    config = TokenizeConfig(
        inputs=[video], out=tmp_path / "a", max_frames=3, vqgan="tiny", checkpoint=data["checkpoint"], device="cpu"
    )
    argv = [video, "--out", str(tmp_path / "a"), "--max-frames", "3", "--vqgan", "tiny"]
    assert (
        from_args(
            TokenizeConfig,
            build_parser().parse_args(argv + ["--checkpoint", str(data["checkpoint"]), "--device", "cpu"]),
        )
        == config
    )
    assert run_config(config) == 0
    assert run(data, tmp_path / "b", "--max-frames", "3", inputs=[video]) == 0
    a, b = (np.load(next((tmp_path / d / "tokens").glob("*.npy"))) for d in ("a", "b"))
    assert (a == b).all() and len(a) == 3
    with pytest.raises(UsageError, match="neither a folder nor a preset"):
        run_config(TokenizeConfig(inputs=[video], out=tmp_path / "c", vqgan="nope"))


def test_images_are_one_frame_videos(data, tmp_path, capsys):
    """A folder of images beside a video: each image one frame of codes, cropped to its center square as
    frames are (a 64 x 64 PNG as it is, a 96 x 64 JPEG's middle 64 columns, a GIF's first frame, a
    palette PNG in RGB), the video as before; a .jpg that is no image is recorded as failed and the run
    goes on. An example naming an image's id trains on its 256 codes closed by <eov>, as LWM trains images."""
    from PIL import Image

    from lwm.data import CodeStore, TextTokenizer, Vocab, encode_example

    rng = np.random.default_rng(0)
    folder = tmp_path / "media"
    folder.mkdir()
    square = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    wide = rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
    Image.fromarray(square).save(folder / "square.png")
    Image.fromarray(wide).save(folder / "wide.jpg", quality=95)
    Image.fromarray(square).save(folder / "anim.gif", save_all=True, append_images=[Image.fromarray(wide[:, :64])])
    Image.fromarray(square).convert("P").save(folder / "palette.png")
    (folder / "broken.jpg").write_bytes(b"not an image at all")
    video = data["good"]["landscape_mp4"]
    out = tmp_path / "out"
    assert run(data, out, "--ids", "stem", inputs=[str(folder), str(video)]) == 1  # broken.jpg failed
    summary = capsys.readouterr().out
    assert "6 videos: 5 done" in summary and "1 failed" in summary, summary
    (failure,) = records(out, "failures.jsonl")
    assert failure["source"].endswith("broken.jpg") and "cannot open as an image" in failure["error"]
    manifest = {r["id"]: r for r in records(out, "manifest.jsonl")}
    decoded = {
        "square": square,
        "wide": np.asarray(Image.open(folder / "wide.jpg").convert("RGB"))[:, 16:80],  # the JPEG's own pixels
        "anim": np.asarray(Image.open(folder / "anim.gif").convert("RGB")),  # the first frame
        "palette": np.asarray(Image.open(folder / "palette.png").convert("RGB")),
    }
    for name, pixels in decoded.items():
        record = manifest[name]
        assert record["frames"] == 1 and record["timestamps"] == [0.0] and record["video"]["num_frames"] == 1
        want = data["model"].encode(torch.from_numpy(np.array(pixels))[None]).numpy()
        np.testing.assert_array_equal(np.load(out / record["tokens"]), want, err_msg=name)
    assert manifest["wide"]["video"]["width"] == 96 and manifest[video.stem]["frames"] > 1

    tok = TextTokenizer(ROOT / "data" / "sample" / "tokenizer.model")
    vocab = Vocab(tok.vocab_size)
    example = {"vision": "square", "caption": "a square of noise", "fields": "[vision],caption"}
    encoded = encode_example(example, vocab, tok, CodeStore(out, vocab.n_vision_codes))
    codes = encoded.tokens[encoded.vision_mask]  # the codes and the <eov> that closes the one frame
    assert len(codes) == 257 and codes[-1] == vocab.eov
    np.testing.assert_array_equal(codes[:-1] - vocab.vision_offset, np.load(out / manifest["square"]["tokens"])[0])


def test_inputs_without_any_video_or_image_are_refused_before_any_work(data, tmp_path, capsys):
    """A folder holding no media (a caption table, notes) and an empty list file: exit 2 naming the
    inputs and the extensions looked for, and the output folder is not claimed (no settings.json)."""
    folder = tmp_path / "captions"
    folder.mkdir()
    (folder / "captions.csv").write_text("video,caption\na.mp4,hi\n")
    (tmp_path / "empty.txt").write_text("# nothing yet\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        run(data, out, inputs=[str(folder), str(tmp_path / "empty.txt")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"no video or image in {folder}, {tmp_path / 'empty.txt'}" in err and ".jpg" in err and ".mp4" in err, err
    assert not (out / "settings.json").exists()
