"""One path from a video to its codes (lwm/video/codes.py, lwm/data/sampling.py): the same video gives
the same frame times and codes through every entry point - lwm-tokenize's manifest, the datamodule's
cached codes (CodeStore, also from a cache at a finer rate), lwm-generate and video QA, from the cache
or from the file - on constant-rate, NTSC-rate (29.97 fps), variable-rate and synthetic long videos."""

from __future__ import annotations

import contextlib
import fractions
import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from deps import skip_module_without_decord

skip_module_without_decord()
from video_samples import VFR_PTS_MS, write_video  # noqa: E402

from lwm.data.code_cache import CodeStore  # noqa: E402
from lwm.data.sampling import Sampling, SamplingError, frame_indices  # noqa: E402
from lwm.eval.video_qa.items import Item  # noqa: E402
from lwm.eval.video_qa.videos import VideoSource  # noqa: E402
from lwm.infer import cli  # noqa: E402
from lwm.synth.make_long_videos import main as make_long_videos  # noqa: E402
from lwm.video.codes import CodeSource  # noqa: E402
from lwm.video.reader import Video  # noqa: E402
from lwm.video.tokenize import main as tokenize  # noqa: E402
from lwm.vision.vqgan import VQGAN, VQGANConfig  # noqa: E402


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("video_codes")
    (root / "v").mkdir()
    videos = {
        "cfr": write_video(root / "v" / "cfr.mp4", frames=45, fps=10),  # 4.5 s
        "ntsc": write_video(root / "v" / "ntsc.mp4", frames=100, fps=fractions.Fraction(30000, 1001)),
        "vfr": write_video(root / "v" / "vfr.mp4", pts_ms=VFR_PTS_MS),  # held frames: some repeat at 2 fps
    }
    with contextlib.redirect_stdout(io.StringIO()):
        long_videos = make_long_videos(["--out", str(root / "long"), "--durations", "8", "--per-duration", "1"])
    videos["long"] = next((long_videos / "videos").glob("*.mp4"))
    torch.manual_seed(5)
    model = VQGAN(VQGANConfig.from_preset("tiny")).eval()
    checkpoint = root / "tiny.pt"
    torch.save(model.state_dict(), checkpoint)
    caches = {}
    for fps in (1, 2):
        caches[fps] = root / f"codes{fps}"
        argv = [str(root / "v"), str(videos["long"]), "--out", str(caches[fps]), "--fps", str(fps)]
        argv += ["--vqgan", "tiny", "--checkpoint", str(checkpoint), "--device", "cpu", "--ids", "stem"]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert tokenize(argv) == 0
    return SimpleNamespace(root=root, videos=videos, model=model, checkpoint=checkpoint, caches=caches)


def manifest(cache: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, (cache / "manifest.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("name", ["cfr", "ntsc", "vfr", "long"])
def test_same_frames_through_every_entry_point(made, name):
    path, vid = made.videos[name], made.videos[name].stem
    for fps in (1.0, 2.0):
        tokenized = manifest(made.caches[int(fps)])[vid]  # lwm-tokenize
        decoded = CodeSource(fps, cache=None, vqgan=made.model).from_video(path)  # lwm-generate --video, video QA
        times = np.round(decoded.timestamps, 6)
        assert tokenized["timestamps"] == times.tolist()
        codes = np.load(made.caches[int(fps)] / "tokens" / f"{vid}.npy")
        assert (codes == decoded.codes).all()
        for cache_fps in (1, 2):  # the datamodule (CodeStore), at the cache's rate or from a finer one
            if cache_fps < fps:
                continue
            cached, stamps = CodeStore(made.caches[cache_fps]).sample(vid, fps=fps)
            assert np.round(stamps, 6).tolist() == times.tolist() and (cached == decoded.codes).all()
    # both: the rate's frames, at most max_frames of them spread evenly
    capped = CodeSource(2.0, 3, cache=made.caches[2]).codes(key=vid)
    again = CodeSource(2.0, 3, vqgan=made.model).from_video(path)
    assert capped.origin == "cache" and again.origin == "video" and len(again.codes) == 3
    assert (capped.codes == again.codes).all() and np.allclose(capped.timestamps, again.timestamps)


def test_video_qa_and_generate_from_cache_or_file(made, monkeypatch):
    path = made.videos["ntsc"]
    item = Item(id="q", question="?", answer="a", video=str(path))
    from_file = VideoSource(None, made.checkpoint, fps=1.0, max_frames=2).load(item)
    from_cache = VideoSource(made.caches[2], made.checkpoint, fps=1.0, max_frames=2).load(item)
    assert from_file[1]["codes_from"] == "video" and from_cache[1]["codes_from"] == "cache"
    assert (from_file[0] == from_cache[0]).all() and len(from_file[0]) == 2

    seen = []
    monkeypatch.setattr(cli, "chat_prompt", lambda tok, vocab, prompt, codes, style: seen.append(codes) or [])
    loaded = SimpleNamespace(vqgan=None, prompt="native", tokenizer=None, vocab=SimpleNamespace(n_vision_codes=8192))
    common = dict(prompt="?", raw=False, fps=1.0, max_frames=2, vqgan=str(made.checkpoint), device="cpu")
    common["prompt_style"] = "auto"
    cli.prompt_ids(SimpleNamespace(video=str(path), codes=None, video_id=None, **common), loaded)
    cli.prompt_ids(SimpleNamespace(video=None, codes=str(made.caches[2]), video_id="ntsc", **common), loaded)
    assert (seen[0] == from_file[0]).all() and (seen[1] == from_file[0]).all()


def test_a_coarser_cache_is_refused_not_repeated(made):
    store = CodeStore(made.caches[1])
    with pytest.raises(ValueError, match=r"'cfr' was tokenized with --fps 1; .* cannot be sampled at 2 fps"):
        store.load("cfr", fps=2.0)
    assert store.load("cfr", max_frames=2).shape == (2, 256)  # by count: any cache


def test_the_rule():
    starts = np.array([0.0, 0.1, 0.2, 0.3, 1.0, 1.1, 1.2, 2.5, 2.6, 3.0])  # VFR_PTS_MS
    assert frame_indices(starts, 3.1, Sampling(fps=2.0)).tolist() == [0, 3, 4, 6, 6, 7]  # held frames repeat
    assert frame_indices(starts, 3.1, Sampling(max_frames=4)).tolist() == [0, 3, 6, 9]
    assert frame_indices(starts, 3.1, Sampling(fps=2.0, max_frames=3)).tolist() == [0, 4, 7]
    assert frame_indices(starts, 3.1, Sampling()).tolist() == list(range(10))
    assert frame_indices(starts, 3.1, Sampling(fps=1.0, start=1.05, end=3.1)).tolist() == [4, 6]
    with pytest.raises(SamplingError, match="shorter than one sampling interval"):
        frame_indices(starts, 3.1, Sampling(fps=0.25))


def test_streaming_holds_one_chunk(made, monkeypatch):
    """encode_video decodes in chunks of batch_size frames: the VQGAN never sees more at once. At 2 fps
    the 1 fps video holds each frame twice: the VQGAN encodes each once and both copies get its codes."""
    sizes = []
    encode = made.model.encode
    monkeypatch.setattr(made.model, "encode", lambda frames, batch_size: sizes.append(len(frames)) or encode(frames))
    got = CodeSource(2.0, vqgan=made.model, batch_size=3).from_video(made.videos["long"])
    assert len(got.codes) == 16 and max(sizes) <= 3 and sum(sizes) == 8, sizes
    assert (got.codes[0::2] == got.codes[1::2]).all()
    assert Video(made.videos["long"], 64).duration == pytest.approx(8.0)
