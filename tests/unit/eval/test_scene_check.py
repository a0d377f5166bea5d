"""The text-to-video demo's data (lwm.synth.make_t2v) and the checker of what a video shows
(lwm.eval.scene_check): right on every rendered prompt, right on the clips after the bundled tiny VQGAN's
encoding and decoding (what a generated video is decoded by), and at chance on random codes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lwm.eval.scene_check import read_video
from lwm.synth import make_t2v
from lwm.synth.scene import render


def clips(step: int = 1, seed: int = 0) -> list[tuple[np.ndarray, tuple[str, str, str]]]:
    rng = np.random.default_rng(seed)
    return [(render(make_t2v.scene("x", *p, rng)), p) for p in make_t2v.prompts()[::step]]


def test_every_rendered_prompt_reads_as_its_prompt():
    for frames, prompt in clips():
        assert frames.shape == (4, 64, 64, 3)
        reading = read_video(frames)
        assert reading is not None and all(reading.matches(*prompt).values()), (prompt, reading)
    still = np.repeat(render(make_t2v.scene("x", "red", "square", "left", np.random.default_rng(0)))[:1], 4, axis=0)
    assert read_video(still).motion == "still"
    assert read_video(np.zeros((2, 8, 8, 3), np.uint8)) is None  # nothing drawn
    with pytest.raises(ValueError, match="frames must be"):
        read_video(np.zeros((8, 8, 3), np.uint8))


def test_through_the_tiny_vqgan_clips_still_read_right_and_random_codes_do_not():
    """16 prompts (every 6th), each clip encoded and decoded at the VQGAN's 64x64: all three attributes read right
    on at least 15 (all 96 prompts measured: 96 right); decoded random codes at most 2 (measured: 0 of 96 on all
    three; color 12, shape 32, motion 16 of 96, about chance)."""
    from lwm.interop.vqgan_sources import load_vqgan
    from lwm.paths import TINY_VQGAN
    from lwm.vision.vqgan import to_uint8

    vqgan = load_vqgan(TINY_VQGAN, preset="tiny").eval()
    right = 0
    for frames, prompt in clips(step=6):
        decoded = to_uint8(vqgan.decode(vqgan.encode(torch.from_numpy(frames)))).numpy()  # (4, 64, 64, 3)
        reading = read_video(decoded)
        right += reading is not None and all(reading.matches(*prompt).values())
    assert right >= 15, right
    g = torch.Generator().manual_seed(0)
    lucky = 0
    for _, prompt in clips(step=6):
        codes = torch.randint(0, vqgan.config.n_codes, (4, 256), generator=g)
        reading = read_video(to_uint8(vqgan.decode(codes)).numpy())
        lucky += reading is not None and all(reading.matches(*prompt).values())
    assert lucky <= 2, lucky


@pytest.mark.parametrize("cells", [1, 2])
def test_each_frame_is_the_last_moved_by_whole_code_cells(cells):
    """Starts on the 4-pixel grid of the VQGAN's codes and `cells` cells a frame (--cells): every frame equals
    the one before it shifted by exactly 4 x cells pixels the prompt's way, so the codes can follow the shape
    cell by cell; every prompt reads right."""
    rng = np.random.default_rng(1)
    for color, shape, motion in make_t2v.prompts()[:: 5 // cells]:
        obj = make_t2v.scene("x", color, shape, motion, rng, cells).objects[0]
        assert obj.start[0] % make_t2v.CELL == obj.start[1] % make_t2v.CELL == 0
        frames = render(make_t2v.scene("x", color, shape, motion, rng, cells))
        dx, dy = make_t2v.DIRECTIONS[motion]
        for before, after in zip(frames, frames[1:]):
            moved = np.roll(before, (dy * make_t2v.CELL * cells, dx * make_t2v.CELL * cells), axis=(0, 1))
            assert np.array_equal(moved, after), (color, shape, motion)
        assert all(read_video(frames).matches(color, shape, motion).values())


def test_the_demo_data_holds_prompts_out_and_trains_every_attribute(tmp_path):
    out = make_t2v.run(tmp_path / "t2v", per_prompt=2, n_held_out=16, uncond=0.25)
    lines = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["fields"] == "[caption],vision"]
    assert len(train) == 2 * (96 - 16) and len(held) == 16
    # a seeded share of the clips again without their caption (guidance's unconditional draw)
    uncond = [r for r in lines if r["fields"] == "vision"]
    assert len(uncond) + len(train) == len(lines) and 20 <= len(uncond) <= 60  # 40 expected of 160
    assert {r["vision"] for r in uncond} < {r["vision"] for r in train}
    # the clips as train_vqgan.py reads them: one index line per clip, each naming its MP4
    index = [json.loads(line)["path"] for line in (out / "videos.jsonl").read_text().splitlines()]
    assert sorted(index) == sorted(f"videos/{r['vision']}.mp4" for r in train)
    assert all((out / path).is_file() for path in index)
    seen = {(r["color"], r["shape"], r["motion"]) for r in train}
    unseen = {(r["color"], r["shape"], r["motion"]) for r in held}
    assert not seen & unseen and len(seen | unseen) == 96
    for k in range(3):
        assert {p[k] for p in seen} == {p[k] for p in make_t2v.prompts()}  # every color, shape, motion trained
    row = train[0]
    assert row["caption"] == make_t2v.caption(row["color"], row["shape"], row["motion"])
    assert row["fields"] == "[caption],vision" and (out / "videos" / f"{row['vision']}.mp4").is_file()
    # the codes trained on are the rendered frames' (not the MP4's): decoded, each clip reads as its caption
    from lwm.data.code_cache import CodeStore
    from lwm.interop.vqgan_sources import load_vqgan
    from lwm.paths import TINY_VQGAN
    from lwm.train.export import codes_vqgan
    from lwm.vision.vqgan import to_uint8

    vqgan, store = load_vqgan(TINY_VQGAN).eval(), CodeStore(out / "codes")
    assert codes_vqgan(out / "codes") == TINY_VQGAN  # named in the manifest: the run's export bundles it
    for row in train[::10]:
        codes = store.load(row["vision"])  # (4, 256)
        assert codes.shape == (4, 256)
        with torch.no_grad():
            reading = read_video(to_uint8(vqgan.decode(torch.as_tensor(codes, dtype=torch.long))).numpy())
        assert reading is not None and all(reading.matches(row["color"], row["shape"], row["motion"]).values())
    with pytest.raises(ValueError, match="cannot hold out"):
        make_t2v.held_out(90, np.random.default_rng(0))


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan"])
def test_make_t2v_refuses_an_uncond_share_outside_0_to_1(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        make_t2v.main(["--out", str(tmp_path / "t2v"), "--uncond", value])
    assert (
        e.value.code == 2
        and f"argument --uncond: expected a number from 0 to 1, got '{value}'" in capsys.readouterr().err
    )
    assert not (tmp_path / "t2v").exists()


def test_make_t2v_refuses_a_move_that_leaves_the_frame(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        make_t2v.main(["--out", str(tmp_path / "t2v"), "--cells", "4"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--cells 4: a shape moving 12 cells over 4 frames leaves the 64-pixel frame" in err
    assert not (tmp_path / "t2v").exists()
