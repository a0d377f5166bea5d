"""The one vocabulary table: text ids, then vision codes, then four special tokens.

[0, text_size)                       text ids (the text tokenizer's: sentencepiece or Hugging Face)
[vision_offset, vision_offset+8192)  vision codes
eof, eov, vision_start, vision_end   <eof> <eov> <vision> </vision>
... up to `size`                     padding rows (a multiple of 64)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SPECIAL_TOKENS = ("<eof>", "<eov>", "<vision>", "</vision>")
# A frame is 16x16 = 256 codes followed by <eof> or <eov>; every VQGAN here makes frames of this size.
TOKENS_PER_FRAME = 256


@dataclass(frozen=True)
class Vocab:
    text_size: int
    n_vision_codes: int = 8192
    pad_multiple: int = 64

    def __post_init__(self) -> None:
        if self.text_size <= 0 or self.n_vision_codes <= 0 or self.pad_multiple <= 0:
            raise ValueError(
                f"Vocab sizes must be positive: text_size {self.text_size}, "
                f"n_vision_codes {self.n_vision_codes}, pad_multiple {self.pad_multiple}"
            )

    @property
    def vision_offset(self) -> int:
        return self.text_size

    @property
    def eof(self) -> int:
        return self.text_size + self.n_vision_codes

    @property
    def eov(self) -> int:
        return self.eof + 1

    @property
    def vision_start(self) -> int:
        return self.eof + 2

    @property
    def vision_end(self) -> int:
        return self.eof + 3

    @property
    def used_size(self) -> int:
        """Ids that mean something (text + vision + specials), before padding."""
        return self.eof + len(SPECIAL_TOKENS)

    @property
    def pad_id(self) -> int:
        """Filler for the tail of a packed sequence: the first padding row (never a target)."""
        return self.used_size if self.used_size < self.size else 0

    @property
    def size(self) -> int:
        return -(-self.used_size // self.pad_multiple) * self.pad_multiple

    def check_tokenizer(self, tokenizer) -> None:
        """A text tokenizer must have exactly the vocabulary's text ids."""
        if tokenizer.vocab_size != self.text_size:
            raise ValueError(
                f"text tokenizer has {tokenizer.vocab_size} ids but the vocabulary expects {self.text_size}"
            )

    def video_tokens(
        self, codes: np.ndarray, markers: tuple[list[int], list[int]] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(T, 256) codes -> ids [<vision> f1 <eof> ... fT <eov> </vision>] and a vision mask that
        is True on the codes and the <eof>/<eov> that close each frame (the markers count as text).
        markers: text ids to write in place of the <vision> and </vision> ids (LWM's released
        models read the markers as text)."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] == 0:
            raise ValueError(
                f"codes must be (frames, tokens per frame) with at least one frame, got shape {codes.shape}"
            )
        if codes.min() < 0 or codes.max() >= self.n_vision_codes:
            raise ValueError(f"codes must lie in [0, {self.n_vision_codes}), got [{codes.min()}, {codes.max()}]")
        T, n = codes.shape
        frames = np.empty((T, n + 1), dtype=np.int64)
        frames[:, :n] = codes.astype(np.int64) + self.vision_offset
        frames[:, n] = self.eof
        frames[-1, n] = self.eov
        start, end = markers if markers is not None else ([self.vision_start], [self.vision_end])
        ids = np.concatenate(
            [np.asarray(start, np.int64), frames.reshape(-1), np.asarray(end, np.int64)]
        )  # (T*(n+1) + markers,)
        mask = np.zeros_like(ids, dtype=bool)
        mask[len(start) : len(ids) - len(end)] = True
        return ids, mask

    def is_vision(self, ids: np.ndarray) -> np.ndarray:
        """True where ids are vision codes or <eof>/<eov>."""
        ids = np.asarray(ids)
        return (ids >= self.vision_offset) & (ids <= self.eov)

    def added_tokens(self) -> list[str]:
        """Token strings for ids [text_size, used_size), in id order (for a Hugging Face tokenizer)."""
        return [vision_token_name(i) for i in range(self.n_vision_codes)] + list(SPECIAL_TOKENS)


def vision_token_name(code: int) -> str:
    return f"<vision_{code}>"
