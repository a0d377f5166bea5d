"""A character tokenizer for the evaluation's stubs (ids 3..130): enough to read prompts back."""


class Tok:
    bos_id, eos_id, vocab_size = 1, 2, 131

    def encode(self, text):
        return [3 + min(ord(c), 127) for c in text]

    def decode(self, ids):
        return "".join(chr(i - 3) for i in ids if 3 <= i < self.vocab_size)

    def with_bos(self, ids):
        return [self.bos_id, *ids]
