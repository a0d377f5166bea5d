"""The video part of a prompt: which VQGAN encodes a video by default (the chat form itself is
lwm.data.chat, the training data's format; a video's codes come from lwm.video.codes)."""

from __future__ import annotations

from lwm.paths import TINY_VQGAN

# data/ is in the repository, not the package (installed editable): found from the package's
# location, so the default works from any working directory
DEFAULT_VQGAN = TINY_VQGAN
