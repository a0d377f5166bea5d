"""A vision-language model as one folder: the Hugging Face LLaMA files, the VQGAN that made its
codes (a diffusers VQModel folder in vqgan/), and lwm.json, which says how its prompts are written.

    DIR/config.json, model*.safetensors, tokenizer*   the language model (AutoModelForCausalLM)
    DIR/vqgan/config.json, diffusion_pytorch_model.safetensors   (diffusers.VQModel.from_pretrained)
    DIR/lwm.json   {"prompt": "lwm" | "native" | "template", "vqgan": "vqgan" | null, ...notes}

Prompt styles: "native", this project's (<vision> and </vision> are special ids, lwm.data.Vocab);
"lwm", LWM's released models (the markers are written as text, as LWM's own code does); "template", a
model trained from a base with a chat template (Llama-3-Instruct, Qwen): its template, the video in the
user's turn (lwm.data.chat).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lwm.data.chat import PROMPT_STYLES
from lwm.interop.diffusers import to_diffusers
from lwm.interop.hf_files import read_json_object, stays_inside

INFO = "lwm.json"
VQGAN_DIR = "vqgan"


@dataclass(frozen=True)
class BundleInfo:
    prompt: str = "native"
    vqgan: Path | None = None  # the VQGAN's folder, when the bundle has one


def write_bundle_info(out_dir: Path, prompt: str, vqgan=None, **notes) -> Path:
    """Write lwm.json and, given a lwm VQGAN, its diffusers folder in out_dir/vqgan."""
    if prompt not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {prompt!r}")
    out_dir = Path(out_dir)
    if vqgan is not None:
        to_diffusers(vqgan).save_pretrained(out_dir / VQGAN_DIR)
    info = {"prompt": prompt, "vqgan": VQGAN_DIR if vqgan is not None else None, **notes}
    (out_dir / INFO).write_text(json.dumps(info, indent=2, default=str) + "\n")
    return out_dir / INFO


def read_bundle_info(folder: Path) -> BundleInfo:
    """A folder without lwm.json is a plain Hugging Face LLaMA: native prompts, no VQGAN."""
    path = Path(folder) / INFO
    if not path.is_file():
        return BundleInfo()
    info = read_json_object(path)
    prompt = info.get("prompt", "native")
    if prompt not in PROMPT_STYLES:
        raise ValueError(f"{path}: prompt must be one of {PROMPT_STYLES}, got {prompt!r}")
    vqgan = info.get("vqgan")
    if vqgan is not None and not stays_inside(vqgan):
        raise ValueError(f"{path}: vqgan {vqgan!r:.200} must name a folder inside {folder}, relative to it")
    if vqgan is not None and not (Path(folder) / vqgan / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} names the VQGAN folder {vqgan!r}, but {Path(folder) / vqgan}/config.json is missing"
        )
    return BundleInfo(prompt, Path(folder) / vqgan if vqgan is not None else None)
