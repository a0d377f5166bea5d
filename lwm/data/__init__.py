"""Vocabulary layout, text tokenizer, interleaving, packing, datasets."""

from lwm.data.vocab import SPECIAL_TOKENS, Vocab, vision_token_name

__all__ = ["SPECIAL_TOKENS", "Vocab", "vision_token_name"]
