"""Long-context inference: context-parallel prefill, a KV cache sharded over the group, generation
and scoring."""

from lwm.infer.generator import Generator
from lwm.infer.load import Loaded, load_model
from lwm.infer.sampling import GenerationConfig

__all__ = ["GenerationConfig", "Generator", "Loaded", "load_model"]
