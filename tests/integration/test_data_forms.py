"""Data as people have it, from raw files to a run in two commands: mp4s (PyAV) and images (Pillow), a caption
table naming them and a LLaVA conversation file; `lwm-tokenize --source` caches the codes of the media each
source names, and `python train.py data=custom` trains on both sources as they are, no example skipped."""

from __future__ import annotations

import io
import json
import re
import tarfile

import numpy as np
import pytest
from PIL import Image
from readme_commands import readme_command
from train_runs import ROOT, forked_train
from video_samples import write_video

from lwm.video.tokenize import main as tokenize

SAMPLE_TOKENIZER = ROOT / "data" / "sample" / "tokenizer.model"


def make_media(root):
    """Three short mp4s and three images under root/clips and root/images (paths relative to root)."""
    rng = np.random.default_rng(0)
    (root / "clips").mkdir()
    (root / "images").mkdir()
    for i in range(3):
        write_video(root / "clips" / f"clip{i}.mp4", frames=8, fps=4)
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(root / "images" / f"im{i}.png")


def make_sources(root):
    """A caption CSV (a cell holding the delimiter) and a LLaVA JSON array: videos, images, several turns, a
    placeholder or none, a text-only conversation."""
    rows = ["clip,caption"] + [f'clips/clip{i}.mp4,"a clip, number {i}"' for i in range(3)]
    rows += [f"images/im{i}.png,noise picture {i}" for i in range(3)]
    (root / "captions.csv").write_text("\n".join(rows) + "\n")

    def turns(*texts):
        return [{"from": ("human", "gpt")[k % 2], "value": t} for k, t in enumerate(texts)]

    chats = [
        {"id": f"v{i}", "video": f"clips/clip{i}.mp4", "conversations": turns("<video>\nWhat is shown?", f"Clip {i}.")}
        for i in range(3)
    ]
    chats += [
        {
            "id": f"i{i}",
            "image": f"images/im{i}.png",
            "conversations": turns("Describe it.", "Noise.", "Colors?", "Many."),
        }
        for i in range(3)
    ]
    chats.append({"id": "t", "conversations": turns("Say hi.", "Hi.")})
    (root / "llava.json").write_text(json.dumps(chats, indent=1))
    write_shard(root / "shards" / "000000.tar", root / "images")


def write_shard(path, images):
    """A webdataset shard as LAION's are written: per sample a .jpg, a .txt caption and a .json of metadata;
    12 samples (4 of each image), enough for a batch of the custom schedule's first stage."""
    path.parent.mkdir()
    with tarfile.open(path, "w") as tar:
        for i, image in enumerate(sorted(images.glob("*.png")) * 4):
            jpg = io.BytesIO()
            Image.open(image).save(jpg, format="JPEG")
            members = {
                "jpg": jpg.getvalue(),
                "txt": f"noise picture {i}".encode(),
                "json": json.dumps({"i": i}).encode(),
            }
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def codes(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    make_media(root)
    make_sources(root)
    out = root / "codes"
    common = ["--out", str(out), "--vqgan", "tiny", "--device", "cpu"]
    assert tokenize(["--source", str(root / "captions.csv"), "--media", "clip", *common]) == 0
    assert tokenize(["--source", str(root / "llava.json"), "--media", "video", "image", *common]) == 0
    return root, out


def test_lwm_tokenize_takes_the_media_a_source_names(codes, capsys):
    """Every media file the two sources name has one record, keyed by its absolute path; a rerun has nothing
    left to do."""
    root, out = codes
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    want = {str(root / "clips" / f"clip{i}.mp4") for i in range(3)} | {
        str(root / "images" / f"im{i}.png") for i in range(3)
    }
    assert sorted(r["source"] for r in manifest) == sorted(want)
    common = ["--out", str(out), "--vqgan", "tiny", "--device", "cpu"]
    assert tokenize(["--source", str(root / "llava.json"), "--media", "video", "image", *common]) == 0
    assert "6 videos: 0 done" in capsys.readouterr().out  # the CSV named them all first


@pytest.mark.parametrize(
    "args,message",
    [
        (["--media", "video_path"], "has no column 'video_path'"),
        ([], "--source and --media go together"),
    ],
)
def test_a_source_without_the_column_is_refused_before_any_work(codes, tmp_path, capsys, args, message):
    root, _ = codes
    with pytest.raises(SystemExit) as e:
        tokenize(["--source", str(root / "captions.csv"), *args, "--out", str(tmp_path / "o"), "--vqgan", "tiny"])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


FORMS = {  # docs/data.md's commands of each form: the source's name in data.sources, its lwm-tokenize line
    "caps": "lwm-tokenize --out codes --source captions.csv",
    "chat": "lwm-tokenize --out codes --source llava.json",
    "pairs": "lwm-tokenize --out codes shards/",
}


def as_written(command: list[str], root) -> list[str]:
    """A docs line with its placeholders the test's files."""
    names = {"tok.model": str(SAMPLE_TOKENIZER), "codes": str(root / "codes"), "shards/": str(root / "shards")}
    for name in ("captions.csv", "llava.json", "shards/000000.tar"):
        names[name] = str(root / name)
    out = []
    for arg in command:
        for placeholder, path in sorted(names.items(), key=lambda kv: -len(kv[0])):
            arg = re.sub(rf"(?<![\w/.]){re.escape(placeholder)}(?![\w/.])", path, arg)
        out.append(arg)
    return out


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_trains_from_raw_files_as_the_docs_write_it(codes, tmp_path, form):
    """docs/data.md's two commands of the form, as written but for the test's files, the tiny VQGAN and 3 steps a
    stage: every example of the source trains (none skipped), and the stage's report counts its vision tokens."""
    root, _ = codes
    tokenize_line = as_written(readme_command(FORMS[form]), root)
    assert tokenize([*tokenize_line[1:], "--vqgan", "tiny", "--device", "cpu"]) == 0
    train_line = as_written(
        readme_command(
            f"python train.py data=custom data.tokenizer=tok.model data.codes=codes data.sources='{{{form}:"
        ),
        root,
    )
    short = [f"schedule.stages.{i}.{k}=3" for i in (0, 1) for k in ("steps", "warmup_steps")] + ["data.num_workers=0"]
    run = tmp_path / "run"
    proc = forked_train(run, *train_line[2:], *short, debug=False)
    for stage in ("s512", "s2k"):
        report = json.loads((run / stage / "data.json").read_text())
        assert report["skipped"] == 0 and report["read"] > 0, (report, proc.stdout[-3000:])
        assert report["vision_tokens"] > 0, report
    assert "vision tokens trained on" in proc.stdout
