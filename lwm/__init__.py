"""lwm: LWM-style video-language models with million-token context, in PyTorch."""

__version__ = "0.1.0"
