"""The plain LLaMA-architecture model. Single-process: it knows nothing of other processes."""

from lwm.model.attention import AttentionFn, sdpa_attention
from lwm.model.config import PRESETS, ModelConfig, RopeScaling
from lwm.model.loss import IGNORE_INDEX, LossOutput, chunked_cross_entropy, group_counts, token_coefficients
from lwm.model.transformer import Transformer

__all__ = [
    "AttentionFn",
    "IGNORE_INDEX",
    "LossOutput",
    "ModelConfig",
    "PRESETS",
    "RopeScaling",
    "Transformer",
    "chunked_cross_entropy",
    "group_counts",
    "sdpa_attention",
    "token_coefficients",
]
