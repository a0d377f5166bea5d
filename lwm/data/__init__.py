"""Vocabulary layout, text tokenizer, examples, packing, the packed stream and the datamodule."""

from lwm.data.codes import CodeStore
from lwm.data.dataset import PackedStream, Source, StreamState, to_tensors
from lwm.data.example import Encoded, ExampleError, encode_example, parse_fields
from lwm.data.packing import Packed, Packer
from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import SPECIAL_TOKENS, Vocab, vision_token_name

_DATAMODULE = ("DataConfig", "LWMDataModule", "Sharding", "shard_batch")


def __getattr__(name: str):
    # The datamodule imports Lightning (seconds); tools that only tokenize or build prompts skip it.
    if name in _DATAMODULE:
        from lwm.data import datamodule

        return getattr(datamodule, name)
    raise AttributeError(f"module 'lwm.data' has no attribute {name!r}")


__all__ = [
    "CodeStore",
    "DataConfig",
    "Encoded",
    "ExampleError",
    "LWMDataModule",
    "Packed",
    "PackedStream",
    "Packer",
    "SPECIAL_TOKENS",
    "Sharding",
    "Source",
    "StreamState",
    "TextTokenizer",
    "Vocab",
    "encode_example",
    "parse_fields",
    "shard_batch",
    "to_tensors",
    "vision_token_name",
]
