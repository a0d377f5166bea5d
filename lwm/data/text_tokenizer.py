"""The text tokenizer: a sentencepiece model (the bundled one for `tiny`, LLaMA-2's for `7b`)."""

from __future__ import annotations

from pathlib import Path

import sentencepiece as spm


class TextTokenizer:
    def __init__(self, model_path: str | Path):
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"sentencepiece model {path} does not exist")
        self.path = path
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as e:  # "could not parse ModelProto": another kind of file
            raise ValueError(f"{path} is not a sentencepiece model ({e})") from None
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()
        if self.bos_id < 0 or self.eos_id < 0:
            raise ValueError(f"sentencepiece model {path} has no BOS/EOS (bos {self.bos_id}, eos {self.eos_id})")

    @property
    def vocab_size(self) -> int:
        """Text ids: [0, vocab_size); the vision codes start here (lwm.data.Vocab)."""
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids) -> str:
        return self.sp.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size])
