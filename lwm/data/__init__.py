"""Vocabulary layout, text tokenizer, examples, sources and their indexes, packing and its plan, the packed
stream and its batches for one rank (no Lightning here: the datamodule that serves them is lwm.train.datamodule)."""

from lwm.data.batches import DataConfig, ShardedBatches, Sharding, shard_batch
from lwm.data.code_cache import CodeStore
from lwm.data.example import Encoded, ExampleError, encode_example, parse_fields
from lwm.data.index import IndexNotWritable
from lwm.data.packing import Packed, Packer
from lwm.data.stream import (
    EpochTooLarge,
    PackedStream,
    SkippedTooMany,
    Source,
    SourceChanged,
    StaleIndex,
    StreamState,
    TooLittleData,
    to_tensors,
)
from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import SPECIAL_TOKENS, Vocab, vision_token_name

__all__ = [
    "CodeStore",
    "DataConfig",
    "Encoded",
    "EpochTooLarge",
    "IndexNotWritable",
    "ExampleError",
    "Packed",
    "PackedStream",
    "Packer",
    "SPECIAL_TOKENS",
    "ShardedBatches",
    "Sharding",
    "SkippedTooMany",
    "StaleIndex",
    "TooLittleData",
    "Source",
    "SourceChanged",
    "StreamState",
    "TextTokenizer",
    "Vocab",
    "encode_example",
    "parse_fields",
    "shard_batch",
    "to_tensors",
    "vision_token_name",
]
