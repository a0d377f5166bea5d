"""lwm/eval/vniah.py (frames x depth grid of visual needles) and lwm/synth/make_card_qa.py (video QA about the
cards). References: a nearest-centroid probe on the codes, fitted on frames of other seeds, reads
the needle (or the cards) back from the prompt or the written videos."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tables import squeeze
from train_runs import forked_command

from lwm.data import TextTokenizer, Vocab  # noqa: E402
from lwm.eval import vniah  # noqa: E402
from lwm.eval import vniah_grid as vg  # noqa: E402
from lwm.infer.runtime import ModelOptions  # noqa: E402
from lwm.interop.vqgan_sources import load_vqgan  # noqa: E402
from lwm.paths import REPO  # noqa: E402
from lwm.synth import make_card_qa, make_vniah  # noqa: E402

ROOT = REPO

TOKENIZER = ROOT / "data" / "sample" / "tokenizer.model"
NAMES = [*make_vniah.NEEDLE_COLORS, make_vniah.NO_NEEDLE]


@pytest.fixture(scope="module")
def vqgan():
    return load_vqgan(make_vniah.DEFAULT_CHECKPOINT).eval()


@pytest.fixture(scope="module")
def reader(vqgan):
    """Frame codes (N, 256) -> class names, by a probe fitted on frames never used for evaluation."""
    x, y = make_vniah.labelled_frames(10, seed=7)
    hists = make_vniah.code_histograms(vqgan, x)
    return lambda codes: [
        NAMES[c]
        for c in make_vniah.nearest_centroid(hists, y, make_vniah.histograms(np.asarray(codes), vqgan.config.n_codes))
    ]


def test_trial_videos_put_the_needle_at_the_depth_and_repeat():
    codes, labels = np.arange(70)[:, None].repeat(4, 1), np.repeat(np.arange(7), 10)
    for frames, depth in ((1, 50.0), (5, 0.0), (5, 50.0), (5, 100.0), (9, 25.0)):
        video, color, at = vg.trial_video(codes, labels, frames, depth, seed=0, trial=0)
        assert video.shape == (frames, 4) and at == round(depth / 100 * (frames - 1))
        kinds = labels[video[:, 0]]
        assert kinds[at] < 6 and make_vniah.NEEDLE_COLORS[kinds[at]] == color
        assert (np.delete(kinds, at) == 6).all()  # every other frame is haystack
        again = vg.trial_video(codes, labels, frames, depth, seed=0, trial=0)
        assert np.array_equal(again[0], video) and again[1:] == (color, at)
    many = {vg.trial_video(codes, labels, 5, 50.0, seed=0, trial=t)[0].tobytes() for t in range(8)}
    assert len(many) == 8


class Reader:
    """A stand-in model that reads the needle from the prompt's codes with the probe and answers
    with its color (or, wrong=True, with a color that is not it)."""

    def __init__(self, tok, vocab, read, wrong=False):
        self.tok, self.vocab, self.read, self.wrong, self.frames = tok, vocab, read, wrong, []

    def _color(self, ids):
        ids = np.asarray(ids)
        codes = ids[(ids >= self.vocab.vision_offset) & (ids < self.vocab.eof)] - self.vocab.vision_offset
        frames = codes.reshape(-1, 256)
        self.frames.append(len(frames))
        found = [c for c in self.read(frames) if c != make_vniah.NO_NEEDLE]
        color = found[0] if found else "red"
        if self.wrong:
            color = make_vniah.NEEDLE_COLORS[(make_vniah.NEEDLE_COLORS.index(color) + 1) % 6]
        return color

    def generate(self, ids, config):
        return self.tok.encode(f"{self._color(ids).capitalize()}.")

    def score(self, ids, conts):
        want = self.tok.encode(f"{self._color(ids).capitalize()}.")
        return [0.0 if list(c) == want else -1.0 for c in conts]


def test_grid_scores_both_methods(vqgan, reader):
    tok = TextTokenizer(TOKENIZER)
    vocab = Vocab(tok.vocab_size)
    frames, depths = [1, 3, 6], [0, 50, 100]
    right = Reader(tok, vocab, reader)
    res = vg.run_vniah(right, tok, vocab, vqgan, frames, depths, trials=2, pool=8)
    assert res["trials_failed"] == 0 and len(res["trials"]) == 18
    assert right.frames == [n for n in frames for _ in depths for _ in range(2) for _ in range(2)]  # once per method
    assert res["accuracy"] == {"generated": 1.0, "ll": 1.0}
    assert [(c["frames"], c["depth"]) for c in res["cells"]] == [(n, d) for n in frames for d in (0.0, 50.0, 100.0)]
    for r in res["trials"]:
        assert r["generated"]["output"] == r["answer"] and r["ll"]["predicted"] == r["answer"][:-1].lower()
        assert {"video_id", "duration", "question", "options", "answer", "task_type"} <= set(r)
    wrong = vg.run_vniah(Reader(tok, vocab, reader, wrong=True), tok, vocab, vqgan, frames, depths, trials=2, pool=8)
    assert wrong["accuracy"] == {"generated": 0.0, "ll": 0.0}
    assert vg.first_color("It is Cyan, not red.") == "cyan" and vg.first_color("I see a card.") is None
    with pytest.raises(ValueError, match="--frames must be positive"):
        vg.run_vniah(right, tok, vocab, vqgan, [0, 2], depths)
    with pytest.raises(ValueError, match="methods must be"):
        vg.run_vniah(right, tok, vocab, vqgan, frames, depths, methods=["letter"])


def test_grid_writes_the_models_prompt_style(vqgan, reader):
    """The prompt is the model's own form: the "lwm" style writes <vision> and </vision> as text, so the
    prompt of a trial is chat_prompt's in that style, not the native one (one style for every model before)."""
    from lwm.data.chat import chat_prompt

    tok = TextTokenizer(TOKENIZER)
    vocab = Vocab(tok.vocab_size)
    seen = []

    class Recorder(Reader):
        def generate(self, ids, config):
            seen.append(list(ids))
            return super().generate(ids, config)

    vg.run_vniah(
        Recorder(tok, vocab, reader), tok, vocab, vqgan, [2], [0], pool=8, methods=["generated"], prompt_style="lwm"
    )
    video = np.asarray(seen[0])
    codes = (video[(video >= vocab.vision_offset) & (video < vocab.eof)] - vocab.vision_offset).reshape(-1, 256)
    assert (
        seen[0]
        == chat_prompt(tok, vocab, vg.QUESTION, codes, style="lwm")
        != chat_prompt(tok, vocab, vg.QUESTION, codes)
    )


@pytest.fixture(scope="module")
def stage_model(tmp_path_factory) -> Path:
    import torch
    from safetensors.torch import save_file

    from lwm.model import ModelConfig, Transformer

    torch.manual_seed(0)
    config = ModelConfig.from_preset("debug", vocab_size=Vocab(TextTokenizer(TOKENIZER).vocab_size).size)
    out = tmp_path_factory.mktemp("vniah_model") / "f6"
    out.mkdir()
    from dataclasses import asdict

    (out / "model_config.json").write_text(json.dumps(asdict(config)))
    save_file(Transformer(config).state_dict(), out / "final.safetensors")
    return out


ARGS = [
    "--tokenizer",
    str(TOKENIZER),
    "--frames",
    "1",
    "3",
    "--depths",
    "0",
    "100",
    "--trials",
    "1",
    "--pool",
    "4",
    "--device",
    "cpu",
]


def test_command_one_process_and_torchrun_agree(stage_model, tmp_path, capsys):
    """The command in this process and on the 2 ranks torchrun starts (forked, under the NCCL contract): the
    same trials and scores."""
    assert vniah.main(["--model", str(stage_model), "--out", str(tmp_path / "one"), *ARGS]) == 0
    out = capsys.readouterr().out
    assert "| depth \\ frames |" in squeeze(out) and "chance 0.167" in out
    res = json.loads((tmp_path / "one" / "vniah.json").read_text())
    assert res["config"]["complete"] and res["config"]["frames"] == [1, 3] and len(res["trials"]) == 4
    assert all(r["error"] is None for r in res["trials"])
    assert (tmp_path / "one" / "vniah_heatmap.png").stat().st_size > 1000
    assert (tmp_path / "one" / "vniah_heatmap_ll.png").stat().st_size > 1000
    two = forked_command("lwm.eval.vniah", ["--model", str(stage_model), "--out", str(tmp_path / "two"), *ARGS], 2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("accuracy generated") == 1  # rank 0 only
    cp2 = json.loads((tmp_path / "two" / "vniah.json").read_text())
    assert cp2["config"]["world_size"] == 2
    key = lambda r: (r["frames"], r["depth"], r["answer"], r["generated"]["output"], r["ll"]["predicted"])  # noqa: E731
    assert [key(r) for r in cp2["trials"]] == [key(r) for r in res["trials"]]
    for a, b in zip(cp2["trials"], res["trials"]):
        assert np.allclose(a["ll"]["scores"], b["ll"]["scores"], atol=1e-3)


def test_command_bad_input(stage_model, tmp_path, capsys):
    for argv, message in [
        (["--model", str(stage_model), "--out", str(tmp_path), *ARGS, "--frames", "0"], "--frames must be positive frame counts, got [0]"),
        (["--model", str(tmp_path / "nope"), *ARGS], f"--model {tmp_path / 'nope'} does not exist"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as refused:
            vniah.main(argv)
        assert refused.value.code == 2 and message in capsys.readouterr().err, message


def test_card_qa_answers_are_what_the_videos_show(tmp_path, vqgan):
    """Every question's answer letter points at the option the video holds: each frame is looked up
    in the frame pool (remade from its seed) to learn what it shows; the first and the last card's
    colors are the answers. The held-out rows load in lwm/eval/video_qa/."""
    from lwm.eval.video_qa.files import read_items
    from lwm.eval.video_qa.videos import VideoSource

    make_card_qa.write(vqgan, tmp_path, n=6, heldout=6, frames=(3, 6), pool=6)
    train = [json.loads(line) for line in open(tmp_path / "train.jsonl")]
    assert len(train) == 6 * 4 and {r["task_type"] for r in train} == {"first", "last"}
    assert sum(len(r["answer"]) > 2 for r in train) == 12  # the bare questions (a color), the rest a letter
    items = read_items(tmp_path / "qa.jsonl")
    assert len(items) == 12 and all(it.error is None for it in items)
    pool, labels = make_vniah.code_pool(vqgan, 2, make_card_qa.HELDOUT_SEED)  # the held-out pool: 6 // 3 per class
    source = VideoSource(tmp_path / "codes")
    for item in items:
        codes, info = source.load(item)
        assert 3 <= len(codes) <= 6 and info["codes_from"] == "cache"
        rows = [int(np.flatnonzero((pool == frame).all(1))[0]) for frame in codes]  # each frame is a pool frame
        cards = [NAMES[labels[r]] for r in rows if labels[r] < 6]
        answer = item.options[item.answer_index]  # the option's text, its letter taken off
        assert len(item.options) == 4 and len(set(item.options)) == 4 and len(set(cards)) == len(cards)
        assert 1 <= len(cards) <= make_card_qa.MAX_CARDS
        assert answer == f"{cards[0 if item.task == 'first' else -1].capitalize()}.", (item.task, answer, cards)


def test_run_takes_every_field_of_its_config(stage_model, tmp_path):
    """run(VniahConfig) in this process, as another command calls it: methods, seed, pool,
    max_new_tokens and the rest land in vniah.json."""
    model = ModelOptions(model=str(stage_model), tokenizer=str(TOKENIZER), device="cpu", layout="zigzag")
    config = vniah.VniahConfig(
        model=model,
        frames=[2],
        depths=[50],
        trials=1,
        methods=["ll"],
        pool=2,
        seed=1,
        max_new_tokens=2,
        out=str(tmp_path),
    )
    assert vniah.run(config) == 0
    res = json.loads((tmp_path / "vniah.json").read_text())
    c = res["config"]
    assert (c["frames"], c["depths"], c["trials"], c["methods"], c["pool"]) == ([2], [50.0], 1, ["ll"], 2)
    assert (c["seed"], c["max_new_tokens"], c["vqgan"], c["layout"]) == (1, 2, str(vniah.TINY_VQGAN), "zigzag")
    assert "generated" not in res["trials"][0] and "ll" in res["trials"][0]
    assert res["trials"][0]["video_id"] == "vniah_2f_50_0" and not (tmp_path / "vniah_heatmap.png").exists()
