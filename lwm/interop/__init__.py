"""Conversions to and from Hugging Face (LLaMA) and diffusers (VQ models)."""
