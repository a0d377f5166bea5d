"""Images and videos from text: frames of vision codes sampled with classifier-free guidance, as LWM does.

    cond, uncond = vision_prompts(tokenizer, vocab, "a red circle moving left", style="native")
    codes = generate_vision(gen, cond, VisionConfig(frames=4, cfg_scale=3.0), uncond)   # (4, 256)

A frame is 256 codes then <eof>, or <eov> after the last one (lwm.data.vocab). Inside a frame only vision
codes are drawn; the marker after the 256th code is forced when the number of frames is given, else drawn
by the model between <eof> and <eov> (at most `max_frames` frames). With an unconditional prompt each token
is drawn from

    uncond + cfg_scale * (cond - uncond)

of the two prompts' logits, computed as one batch of two rows that share a KV cache (Generator.prefill_rows,
KVCache.stack); the drawn token is fed to both. Under torchrun the prompts and the cache are split over the
ranks as for text, and every rank takes the first rank's tokens.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lwm.data.chat import SYSTEM, chat_prompt
from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import TOKENS_PER_FRAME, Vocab
from lwm.infer.generator import Generator
from lwm.infer.sampling import GenerationConfig, check_integer, next_token
from lwm.parallel.comm import broadcast_from_first
from lwm.video.writer import frames_path, write_frames
from lwm.vision.vqgan import to_uint8


@dataclass
class VisionConfig:
    frames: int | None = 1  # None: until the model writes <eov>, at most max_frames
    max_frames: int = 16
    cfg_scale: float = 1.0  # 1: the conditional logits alone (with an unconditional prompt, still computed)
    temperature: float = 1.0  # 0: greedy
    top_k: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.frames is not None:
            check_integer("frames", self.frames, 1, "or None (until <eov>)")
        check_integer("max_frames", self.max_frames, 1)
        s = self.cfg_scale
        if isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(s):
            raise ValueError(f"cfg_scale must be a finite number, got {s!r}")
        self.sampling  # temperature, top_k and seed checked as text generation checks them

    @property
    def sampling(self) -> GenerationConfig:
        return GenerationConfig(temperature=self.temperature, top_k=self.top_k, seed=self.seed)

    @property
    def n_frames(self) -> int:
        """The most frames this generates."""
        return self.frames or self.max_frames


def vision_prompts(
    tokenizer: TextTokenizer,
    vocab: Vocab,
    prompt: str,
    style: str = "native",
    video: bool = False,
    codes: np.ndarray | None = None,
    raw: bool = False,
) -> tuple[list[int], list[int]]:
    """(conditional, unconditional) prompt ids, each ending where the first code of a new frame comes.

    raw: [BOS] prompt <vision>, what a caption-then-clip example trains (a source with direction
    generation); else the chat form of lwm.data.chat with the prompt as the user's turn and the assistant's
    answer opening with <vision>, and for style "lwm" LWM's own words, "Generate an image of {prompt}" (a
    video: "Generate a video of"), as its vision_generation.py writes them. The unconditional prompt is
    [BOS] <vision>, LWM's. codes (T, 256): frames to go on from (an image or a video), after <vision> in
    both prompts, each closed by <eof>."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"the prompt must be non-empty text, got {prompt!r}")
    opening = tokenizer.encode("<vision>") if style == "lwm" else [vocab.vision_start]  # LWM reads it as text
    if raw:
        cond = tokenizer.with_bos(tokenizer.encode(prompt)) + opening
    elif style == "lwm":  # LWM's string, "<vision>" in it, encoded whole
        what = "a video" if video else "an image"
        cond = tokenizer.with_bos(tokenizer.encode(f"{SYSTEM} USER: Generate {what} of {prompt} ASSISTANT: <vision>"))
    else:
        cond = chat_prompt(tokenizer, vocab, prompt, style=style) + opening
    uncond = tokenizer.with_bos(list(opening))
    if codes is not None:
        frames, _ = vocab.video_tokens(codes)
        given = frames[1:-1].reshape(len(codes), TOKENS_PER_FRAME + 1)  # (T, 257): without <vision>, </vision>
        given[-1, -1] = vocab.eof  # more frames follow
        cond, uncond = cond + given.reshape(-1).tolist(), uncond + given.reshape(-1).tolist()
    return cond, uncond


@torch.no_grad()
def generate_vision(gen: Generator, prompt, config: VisionConfig, uncond=None) -> torch.Tensor:
    """New frames' codes (T, 256) long in [0, n_vision_codes) on the host, after prompt (ids ending where a
    frame's first code comes); uncond: the unconditional prompt for guidance, None for none."""
    vocab, device = gen.vocab, gen.device
    codes_only = torch.zeros(vocab.size, dtype=torch.bool, device=device)
    codes_only[vocab.vision_offset : vocab.vision_offset + vocab.n_vision_codes] = True
    markers = torch.zeros_like(codes_only)
    markers[[vocab.eof, vocab.eov]] = True
    eof, eov = (torch.tensor([t], device=device) for t in (vocab.eof, vocab.eov))
    sampling = config.sampling
    rng = torch.Generator(device=device).manual_seed(config.seed)
    frames = torch.empty(config.n_frames, TOKENS_PER_FRAME, dtype=torch.long, device=device)
    n = 0
    try:
        rows = [prompt] if uncond is None else [prompt, uncond]
        logits = gen.prefill_rows(rows, reserve=config.n_frames * (TOKENS_PER_FRAME + 1))  # (B, V)

        def draw(allowed: torch.Tensor) -> torch.Tensor:  # (1,), the same on every rank
            guided = logits[0] if uncond is None else logits[1] + config.cfg_scale * (logits[0] - logits[1])
            return broadcast_from_first(next_token(guided, sampling, allowed, rng), gen.group)

        while True:
            for i in range(TOKENS_PER_FRAME):
                token = draw(codes_only)
                frames[n, i : i + 1] = token
                logits = gen.extend_rows(token)
            n += 1
            if config.frames is not None:
                last = n == config.frames
                marker = eov if last else eof
            else:
                marker = draw(markers)
                last = n == config.max_frames or bool(marker == eov)  # one read to the host a frame
            if last:
                break
            logits = gen.extend_rows(marker)
    finally:
        gen.release()
    return (frames[:n] - vocab.vision_offset).cpu()


def save_vision(codes: torch.Tensor, vqgan, path: str | Path, fps: int = 4) -> tuple[Path, Path]:
    """codes (T, 256) decoded by the VQGAN into path (.png for one frame, .gif or .mp4: lwm.video.writer) and
    saved beside it as <name>.codes.npy (int32) -> (the picture or video, the codes)."""
    path = frames_path(path)  # checked before decoding
    return write_vision(codes, decode_frames(vqgan, codes), path, fps)


@torch.no_grad()
def decode_frames(vqgan, codes: torch.Tensor) -> np.ndarray:
    """codes (T, 256) -> frames (T, H, W, 3) uint8 on the host, by the VQGAN on its own device."""
    ref = next(vqgan.parameters())
    return to_uint8(vqgan.decode(torch.as_tensor(codes).to(ref.device))).numpy()


def write_vision(codes: torch.Tensor, frames: np.ndarray, path: str | Path, fps: int = 4) -> tuple[Path, Path]:
    """frames (T, H, W, 3) uint8, the decoding of codes (T, 256), into path, the codes beside it (save_vision)."""
    path = frames_path(path)
    write_frames(path, frames, fps)
    codes_path = path.with_suffix(".codes.npy")
    np.save(codes_path, np.asarray(codes, dtype=np.int32))
    return path, codes_path
