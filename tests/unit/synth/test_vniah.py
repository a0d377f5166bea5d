"""lwm/synth/make_vniah.py: the visual needle is designed so that the tiny VQGAN's codes carry its
answer. A nearest-centroid probe on the codes of held-out frames tells the six needle colors and
"no needle" (haystack frames) apart; fitted on shuffled labels it is at chance."""

from __future__ import annotations

import numpy as np
import pytest

from lwm.interop.vqgan_sources import load_vqgan
from lwm.paths import REPO
from lwm.synth import make_vniah

ROOT = REPO


@pytest.fixture(scope="module")
def vqgan():
    return load_vqgan(make_vniah.DEFAULT_CHECKPOINT).eval()


def test_the_codes_tell_the_needle_color(vqgan):
    result = make_vniah.probe(vqgan, train_per_class=10, test_per_class=20)
    assert result["accuracy"] >= 0.95, result
    assert min(result["per_class"].values()) >= 0.85, result
    control = make_vniah.probe(vqgan, train_per_class=10, test_per_class=20, shuffle_labels=True)
    assert control["accuracy"] < 0.4, control  # 7 classes: chance is 1/7


def test_needle_frames_vary_and_bad_colors_are_named():
    rng = np.random.default_rng(0)
    a, b = make_vniah.needle_frame("red", rng), make_vniah.needle_frame("red", rng)
    assert a.shape == (64, 64, 3) and a.dtype == np.uint8 and not np.array_equal(a, b)
    with pytest.raises(ValueError, match="needle color must be one of .* got 'gray'"):
        make_vniah.needle_frame("gray", rng)
    frames, labels = make_vniah.labelled_frames(3, seed=0)
    assert frames.shape == (21, 64, 64, 3) and labels.tolist() == [c for c in range(7) for _ in range(3)]


def test_examples_hold_one_needle_whose_color_is_the_answer(tmp_path, vqgan):
    """--out: every video has its frame count and a needle frame at the stated depth (the probe,
    fitted on other frames, reads it as the answer's color), and the rows are in the sample QA's
    chat form."""
    import json

    from lwm.data.code_cache import CodeStore

    make_vniah.write_examples(vqgan, tmp_path, n=12, heldout=4, frames=(2, 4), seed=0, pool=6)
    train_x, train_y = make_vniah.labelled_frames(10, seed=5)
    hists = make_vniah.code_histograms(vqgan, train_x)
    store = CodeStore(tmp_path / "codes")
    names = [*make_vniah.NEEDLE_COLORS, make_vniah.NO_NEEDLE]
    for split, n in (("train", 12), ("heldout", 4)):
        rows = [json.loads(line) for line in open(tmp_path / f"{split}.jsonl")]
        assert len(rows) == n
        for r in rows:
            codes = store.load(r["vision"])  # (frames, 256)
            assert codes.shape == (r["frames"], 256) and 2 <= r["frames"] <= 4
            assert r["fields"] == "[user+vision+assistant],answer" and r["user"].endswith(make_vniah.QUESTION)
            hist = make_vniah.histograms(codes, vqgan.config.n_codes)
            pred = [names[c] for c in make_vniah.nearest_centroid(hists, train_y, hist)]
            at = round(r["depth"] / 100 * (r["frames"] - 1))
            assert pred[at] == r["answer"].removesuffix(".").lower(), (pred, r)


@pytest.mark.parametrize("maker", ["make_vniah", "make_card_qa"])
def test_the_codes_manifest_names_the_vqgan_so_the_export_bundles_it(tmp_path, monkeypatch, maker):
    import importlib

    from lwm.train.export import codes_vqgan

    module = importlib.import_module(f"lwm.synth.{maker}")
    pool = module.code_pool
    monkeypatch.setattr(module, "code_pool", lambda vqgan, per_class, seed: pool(vqgan, 2, seed))  # time: 2 a class
    args = ["--out", str(tmp_path / "set"), "--codes", str(tmp_path / "codes"), "--n", "2", "--heldout", "1"]
    assert module.main([*args, "--frames", "3", "3"]) == 0
    assert len(list((tmp_path / "codes").glob("manifest.*.jsonl"))) == 2  # training and held-out
    assert codes_vqgan(tmp_path / "codes") == make_vniah.DEFAULT_CHECKPOINT
