"""lwm as an lmms-eval model, so lmms-eval's video tasks run on a model trained here:

    python -m lmms_eval --model lwm --model_args pretrained=runs/x/hf[,max_frames=32,fps=1,codes=DIR,vqgan=CKPT,cp=2] \\
        --tasks videomme --batch_size 1

lmms-eval finds it through the entry point `lwm` of the group `lmms_eval.models` (pyproject.toml). Each
request's video becomes codes as `python -m lwm.eval.video_qa` makes them (lwm.eval.video_qa.videos.VideoSource:
the code cache where it holds the video, else its frames sampled by the one sampling rule and encoded by the
folder's VQGAN); an image (a file, or the PIL image image tasks hand over) is a one-frame video, encoded as
lwm-tokenize encodes an image file. The task's text goes after the video
in the folder's chat form, and lwm.infer generates greedily (text tokens only) or scores a continuation.
lmms-eval then reads the answers and computes the metrics by the task's own rules.
"""

from __future__ import annotations

from pathlib import Path

import torch
from lmms_eval.api.instance import GenerationResult, Instance
from lmms_eval.api.model import lmms
from tqdm import tqdm

from lwm.eval.video_qa.items import Item, ItemError
from lwm.eval.video_qa.scoring import VideoPrompt
from lwm.eval.video_qa.videos import VideoSource
from lwm.infer.runtime import ModelOptions, load_generator, start
from lwm.infer.sampling import GenerationConfig
from lwm.infer.spawned import start_ranks
from lwm.paths import TINY_VQGAN


def manifest():
    """The entry point lmms-eval reads: model id `lwm` and where its class is."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id="lwm", simple_class_path="lwm.eval.lmms.LWM")


def _number(value, kind):
    return None if value in (None, "", "None") else kind(value)


class LWM(lmms):
    """`pretrained`: a folder train.py exported (or lwm-convert-lwm made); `codes`: an lwm-tokenize folder
    tried first; `vqgan`: the checkpoint that encodes videos not in it (default: the folder's own);
    `fps` / `max_frames`: which frames (the one sampling rule); `max_new_tokens`: when the task gives none;
    `cp`: ranks that prefill each prompt together (context parallel: processes it starts, lwm.infer.spawned;
    on CUDA rank r uses cuda:r), for videos whose prompt does not fit one device."""

    def __init__(
        self,
        pretrained: str,
        tokenizer: str | None = None,
        codes: str | None = None,
        vqgan: str | None = None,
        fps=1.0,
        max_frames=None,
        device: str | None = None,
        dtype: str = "auto",
        max_new_tokens=32,
        cp=1,
        **kwargs,  # lmms-eval passes batch_size and the like; one request at a time here
    ):
        super().__init__()
        if not Path(pretrained).exists():
            raise ValueError(f"model_args pretrained={pretrained}: no such folder or file")
        cp = 1 if _number(cp, int) is None else int(cp)
        if cp < 1:
            raise ValueError(f"model_args cp={cp}: the ranks that prefill each prompt, 1 or more")
        options = ModelOptions(model=str(pretrained), tokenizer=tokenizer, device=device, dtype=dtype)
        if cp > 1:  # lmms-eval shards requests over torchrun's ranks itself: the model starts its own
            loaded, self.generator = start_ranks(options, cp, device)
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        else:
            runtime = start(device)
            loaded, self.generator = load_generator(options, runtime)
            device = runtime.device
        self.tokenizer, self.vocab = loaded.tokenizer, loaded.vocab
        self.source = VideoSource(
            codes,
            vqgan or loaded.vqgan or TINY_VQGAN,
            fps=_number(fps, float),
            max_frames=_number(max_frames, int),
            device=device,
            n_codes=loaded.vocab.n_vision_codes,
        )
        self.prompts = VideoPrompt(self.generator, self.tokenizer, self.vocab, loaded.prompt)
        self.max_new_tokens = int(max_new_tokens)

    def _prompt(self, request: Instance, context: str) -> tuple[list[int], dict]:
        """The chat prompt of the request's video and text, and its doc."""
        _, _, doc_to_visual, doc_id, task, split = request.args[:6]
        doc = self.task_dict[task][split][doc_id]
        visuals = doc_to_visual(doc) if doc_to_visual is not None else []
        picture = len(visuals) == 1 and hasattr(visuals[0], "convert")  # a PIL image: a one-frame video
        if len(visuals) != 1 or not (picture or isinstance(visuals[0], (str, Path))):
            raise ValueError(
                f"{task} doc {doc_id}: lwm answers about one video or image (a file path, or a PIL image), "
                f"got {visuals!r}"
            )
        try:
            if picture:
                codes = self.source.image_codes(visuals[0])
            else:
                path = str(visuals[0])  # a video or an image file
                codes, _ = self.source.load(Item(id=f"{task}:{doc_id}", video=path, video_key=Path(path).stem))
        except ItemError as e:
            raise ValueError(f"{task} doc {doc_id}: {e}") from e
        return self.prompts.prompt(context, codes), doc

    def generate_until(self, requests: list[Instance]) -> list[str]:
        out = []
        for request in tqdm(requests, desc="lwm", disable=self.rank != 0):
            context, gen_kwargs = request.args[0], dict(request.args[1] or {})
            prompt, _ = self._prompt(request, context)
            text = self.prompts.generate(prompt, int(gen_kwargs.get("max_new_tokens", self.max_new_tokens)))
            until = gen_kwargs.get("until") or []
            for stop in [until] if isinstance(until, str) else until:
                text = text.split(stop)[0] if stop else text
            out.append(text)
        return out

    def loglikelihood(self, requests: list[Instance]) -> list:
        """(negative log-likelihood of the continuation, whether greedy decoding gives it), the form lmms-eval's
        multiple-choice scoring takes the smallest of; wrapped as a GenerationResult, which lmms-eval 0.7.3
        passes through unchanged (a bare tuple it turns into its text)."""
        out = []
        for request in tqdm(requests, desc="lwm", disable=self.rank != 0):
            context, continuation = request.args[0], request.args[1]
            prompt, doc = self._prompt(request, context)
            if callable(continuation):  # output_type loglikelihood: the task's doc_to_target
                continuation = continuation(doc)
            ids = self.tokenizer.encode(str(continuation))
            if not ids:
                raise ValueError(f"{request.args[4]} doc {request.args[3]}: an empty continuation {continuation!r}")
            logp = self.generator.score(prompt, [ids])[0]
            greedy = self.generator.generate(prompt, GenerationConfig(max_new_tokens=len(ids), restrict="text"))
            out.append(GenerationResult(text=(-logp, list(greedy) == ids)))
        return out

    def generate_until_multi_round(self, requests) -> list[str]:
        raise NotImplementedError("lwm answers one round: use a task whose output_type is generate_until")
