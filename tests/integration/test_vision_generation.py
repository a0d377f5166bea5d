"""Images and videos from text (lwm.infer.vision): classifier-free guidance is LWM's formula over two separate
unguided passes at every step (here: full forwards without a cache), scale 1 is plain conditional sampling token
for token, a context-parallel group draws one process's codes, the frame structure is kept, and lwm-generate
writes what the VQGAN decodes from the codes it saves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lwm.data.vocab import TOKENS_PER_FRAME, Vocab
from lwm.infer import Generator
from lwm.infer.vision import VisionConfig, generate_vision
from lwm.model import ModelConfig, Transformer
from lwm.parallel.launch import run_distributed

VOCAB = Vocab(300, n_vision_codes=64, pad_multiple=8)
COND = [1, *range(20, 43), VOCAB.vision_start]  # 25 tokens: a text prompt opening a vision span
UNCOND = [1, VOCAB.vision_start]  # LWM's unconditional prompt
GIVEN = torch.randint(0, 64, (1, TOKENS_PER_FRAME), generator=torch.Generator().manual_seed(1))  # a frame to go on from


def make_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("debug", vocab_size=VOCAB.size)).eval()


def frame_ids(codes: torch.Tensor, last: bool) -> list[int]:
    """codes (T, 256) -> the ids of the frames, each closed by <eof>, the last by <eov> when `last`."""
    ids = []
    for t, frame in enumerate(codes.tolist()):
        marker = VOCAB.eov if last and t == len(codes) - 1 else VOCAB.eof
        ids += [c + VOCAB.vision_offset for c in frame] + [marker]
    return ids


@torch.no_grad()
def guided_reference(model, codes: torch.Tensor, scale: float) -> torch.Tensor:
    """The guided logits before each generated code, from one full forward (no cache) of each prompt with the
    generated frames after it: (n_codes, V) of uncond + scale * (cond - uncond)."""
    ids = frame_ids(codes, last=True)
    code_at = [i for i, t in enumerate(ids) if t < VOCAB.eof]  # where each code is in the generated part
    passes = [model(torch.tensor([p + ids]))[0, len(p) - 1 :].float() for p in (COND, UNCOND)]  # (len(ids)+1, V)
    cond, uncond = (x[code_at] for x in passes)
    return uncond + scale * (cond - uncond)


def test_guidance_is_the_formula_over_two_separate_passes():
    """Greedy with scale 3 over two frames: each code is the argmax, over the vision codes, of
    uncond + 3 * (cond - uncond) from two separate unguided full forwards; the codes differ from unguided
    greedy's (guidance takes effect)."""
    model = make_model()
    gen = Generator(model, VOCAB)
    config = VisionConfig(frames=2, cfg_scale=3.0, temperature=0)
    codes = generate_vision(gen, COND, config, UNCOND)
    assert codes.shape == (2, TOKENS_PER_FRAME) and codes.dtype == torch.long
    assert 0 <= int(codes.min()) and int(codes.max()) < VOCAB.n_vision_codes
    guided = guided_reference(model, codes, 3.0)[:, VOCAB.vision_offset : VOCAB.eof]  # (512, 64)
    chosen = guided.gather(1, codes.reshape(-1, 1))[:, 0]
    assert torch.equal(guided.argmax(-1), codes.reshape(-1)), (guided.argmax(-1) != codes.reshape(-1)).sum()
    # no near tie decided it: the chosen code leads the next best by more than the cache's rounding
    second = guided.scatter(1, codes.reshape(-1, 1), float("-inf")).max(-1).values
    assert float((chosen - second).min()) > 1e-4
    plain = generate_vision(gen, COND, VisionConfig(frames=2, temperature=0))
    assert not torch.equal(plain, codes)
    assert model.attention_fns() == Generator(model, VOCAB)._original_attention  # the cache was let go


def test_scale_one_is_plain_conditional_sampling_token_for_token():
    """Seeded sampling (temperature 1, top-k 20): guidance at scale 1 (both passes run) draws what
    sampling from the conditional prompt alone draws; another seed draws other codes."""
    gen = Generator(make_model(), VOCAB)
    config = VisionConfig(frames=1, cfg_scale=1.0, temperature=1.0, top_k=20, seed=7)
    guided = generate_vision(gen, COND, config, UNCOND)
    plain = generate_vision(gen, COND, config)
    assert torch.equal(guided, plain)
    other = generate_vision(gen, COND, VisionConfig(frames=1, temperature=1.0, top_k=20, seed=8))
    assert not torch.equal(other, plain)


def test_frames_until_eov_and_at_most_max_frames(monkeypatch):
    """frames=None: the model chooses the marker after each frame between <eof> and <eov>; a model that
    prefers <eov> makes one frame, one that prefers <eof> stops at max_frames; the codes are the same as
    with the number of frames given (the marker is fed back either way)."""
    model = make_model()
    gen = Generator(model, VOCAB)
    logits = model.logits
    for favoured, frames in ((VOCAB.eov, 1), (VOCAB.eof, 2)):
        boost = torch.zeros(VOCAB.size)
        boost[favoured] = 1e4

        def biased(h, boost=boost):
            return logits(h) + boost

        monkeypatch.setattr(model, "logits", biased)
        codes = generate_vision(gen, COND, VisionConfig(frames=None, max_frames=2, temperature=0))
        assert codes.shape == (frames, TOKENS_PER_FRAME)
        if frames == 1:
            assert torch.equal(codes, generate_vision(gen, COND, VisionConfig(frames=1, temperature=0)))


def test_config_is_checked():
    for bad, message in (
        ({"frames": 0}, "frames must be >= 1"),
        ({"max_frames": -1}, "max_frames must be >= 1"),
        ({"cfg_scale": float("nan")}, "cfg_scale must be a finite number"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"top_k": 0}, "top_k must be >= 1"),
    ):
        with pytest.raises(ValueError, match=message):
            VisionConfig(**bad)


GUIDED = VisionConfig(frames=1, cfg_scale=2.5, temperature=1.0, top_k=30, seed=3)


def guided_after_a_frame(group=None) -> torch.Tensor:
    """Codes sampled with guidance going on from GIVEN: its frame after <vision> in both prompts."""
    given = frame_ids(GIVEN, last=False)
    return generate_vision(Generator(make_model(), VOCAB, group=group), COND + given, GUIDED, UNCOND + given)


def _worker(rank: int, world: int) -> torch.Tensor:
    import torch.distributed as dist

    return guided_after_a_frame(dist.group.WORLD)


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_draws_one_process_codes(world):
    """cp 2 and 4 (gloo): every rank draws the codes one process draws, sampled with guidance after a given
    frame (the prompts' lengths, 283 and 260, leave the ranks' cache slices of unequal lengths)."""
    one = guided_after_a_frame()
    for codes in run_distributed(_worker, world):
        assert torch.equal(codes, one)


def test_lwm_generate_writes_what_the_vqgan_decodes(tmp_path, monkeypatch, capsys):
    """lwm-generate --image-out / --video-out with the bundled tiny VQGAN: the PNG's pixels are the VQGAN's
    decode of the saved codes; the MP4 has the frames asked for (the given image's first), their size and
    the fps asked for; the GIF has every frame; bad outputs are refused before any model loads."""
    import av
    from PIL import Image

    from lwm.data.text_tokenizer import TextTokenizer
    from lwm.infer import Loaded, cli
    from lwm.interop.vqgan_sources import load_vqgan
    from lwm.paths import SAMPLE, TINY_VQGAN
    from lwm.vision.vqgan import to_uint8

    vocab = Vocab(4096)  # the sample tokenizer's, with the tiny VQGAN's 8192 codes
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug", vocab_size=vocab.size)).eval()
    loaded = Loaded(model, vocab, TextTokenizer(SAMPLE / "tokenizer.model"))
    monkeypatch.setattr(cli, "load_generator", lambda args, runtime: (loaded, Generator(model, vocab)))
    base = ["--model", str(tmp_path), "--prompt", "a red circle moving left", "--device", "cpu", "--seed", "1"]
    sampled = ["--temperature", "1", "--top-k", "100", "--cfg-scale", "3"]

    assert cli.main([*base, *sampled, "--image-out", str(tmp_path / "a.png")]) == 0
    codes = np.load(tmp_path / "a.codes.npy")
    assert codes.shape == (1, TOKENS_PER_FRAME) and "a.png (1 frame" in capsys.readouterr().out
    vqgan = load_vqgan(TINY_VQGAN, preset="tiny")
    decoded = to_uint8(vqgan.decode(torch.from_numpy(codes).long())).numpy()  # (1, H, W, 3)
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "a.png").convert("RGB")), decoded[0])

    Image.fromarray(decoded[0]).save(tmp_path / "first.png")  # go on from this image for two more frames
    video = ["--image", str(tmp_path / "first.png"), "--frames", "2", "--out-fps", "5"]
    assert cli.main([*base, *sampled, *video, "--video-out", str(tmp_path / "v.mp4")]) == 0
    codes = np.load(tmp_path / "v.codes.npy")
    assert codes.shape == (3, TOKENS_PER_FRAME)
    np.testing.assert_array_equal(codes[0], vqgan.encode(torch.from_numpy(decoded))[0].numpy())  # the given frame
    with av.open(str(tmp_path / "v.mp4")) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        assert stream.average_rate == 5
    size = vqgan.config.resolution
    assert len(frames) == 3 and frames[0].shape == (size, size, 3)

    assert cli.main([*base, "--frames", "2", "--video-out", str(tmp_path / "v.gif")]) == 0
    gif = Image.open(tmp_path / "v.gif")
    assert gif.n_frames == 2 and gif.size == (size, size)

    for extra, message in (
        (["--image-out", str(tmp_path / "a.jpg")], "--image-out .*expected a .png"),
        (["--video-out", str(tmp_path / "v.avi")], "--video-out .*expected a .gif or .mp4"),
        (["--image-out", str(tmp_path / "a.png"), "--frames", "2"], "--image-out makes one frame"),
        (["--video-out", str(tmp_path / "missing" / "v.mp4")], "its folder does not exist"),
        (["--image-out", str(tmp_path / "a.png"), "--cfg-scale", "nan"], "--cfg-scale must be a finite number"),
    ):
        with pytest.raises(SystemExit) as exit_:
            cli.main([*base, *extra])
        assert exit_.value.code == 2
        assert __import__("re").search(message, capsys.readouterr().err), extra
