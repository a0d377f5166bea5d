"""Vision: the VQGAN video tokenizer (encoder, quantizer, decoder) and its checkpoints; its training is
lwm.vqgan_training, video reading and lwm-tokenize are lwm.video."""

from lwm.vision.vqgan import VQGAN, VQGANOutput
from lwm.vision.vqgan_config import PRESETS, TOKENS_PER_FRAME, VQGANConfig

__all__ = ["PRESETS", "TOKENS_PER_FRAME", "VQGAN", "VQGANConfig", "VQGANOutput"]
