"""Generation over a context-parallel group equals generation on one process: greedy tokens equal
a plain full-recompute loop with our model and transformers' generate on the exported model;
scores equal full-forward log-probabilities; no rank holds the whole cache."""

from __future__ import annotations

import pytest
import torch

from lwm.data.vocab import Vocab
from lwm.infer import GenerationConfig, Generator
from lwm.infer.sampling import allowed_ids
from lwm.model import ModelConfig, Transformer
from lwm.parallel.launch import run_distributed
from lwm.paths import REPO

VOCAB = Vocab(4096)
N_NEW = 12
PROMPT_LENGTHS = (45, 64)  # 45: not a multiple of the ring; 64: the last token still goes through extend
CONTINUATIONS = [[5, 6, 7], [8], [VOCAB.vision_start, VOCAB.vision_offset + 3]]


def make_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("debug", vocab_size=VOCAB.size)).eval()


def prompt(length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB.text_size, (length,), generator=torch.Generator().manual_seed(length))


@torch.no_grad()
def reference_greedy(model, ids: torch.Tensor, n: int) -> list[int]:
    """The plain loop: the whole sequence through the model at every step."""
    allowed = allowed_ids(VOCAB, None, [])
    seq = ids.tolist()
    for _ in range(n):
        logits = model(torch.tensor([seq]))[0, -1].masked_fill(~allowed, float("-inf"))
        seq.append(int(logits.argmax()))
    return seq[len(ids) :]


@torch.no_grad()
def reference_scores(model, ids: torch.Tensor, continuations) -> list[float]:
    out = []
    for cont in continuations:
        logp = torch.log_softmax(model(torch.tensor([ids.tolist() + cont]))[0].float(), -1)
        out.append(sum(float(logp[len(ids) - 1 + i, t]) for i, t in enumerate(cont)))
    return out


def _worker(rank: int, world: int, layouts: tuple[str, ...]) -> dict:
    import torch.distributed as dist

    model = make_model()
    result = {}
    for layout in layouts:
        for length in PROMPT_LENGTHS:
            gen = Generator(model, VOCAB, group=dist.group.WORLD, layout=layout)
            result[layout, length, "greedy"] = gen.generate(prompt(length), GenerationConfig(max_new_tokens=N_NEW))
            result[layout, length, "score"] = gen.score(prompt(length), CONTINUATIONS)
            # the ring prefill in segments of ~5 tokens per rank (several segments, each after a cache)
            seg = Generator(model, VOCAB, group=dist.group.WORLD, layout=layout, prefill_chunk=5)
            result[layout, length, "greedy-seg"] = seg.generate(prompt(length), GenerationConfig(max_new_tokens=N_NEW))
            result[layout, length, "score-seg"] = seg.score(prompt(length), CONTINUATIONS)
            gen.prefill(prompt(length))
            for t in range(5):
                gen.extend([t + 10])
            result[layout, length, "cache"] = gen.cache.lengths[0]
            gen.release()
    gen = Generator(model, VOCAB, group=dist.group.WORLD)
    result["sampled"] = gen.generate(
        prompt(45), GenerationConfig(max_new_tokens=N_NEW, temperature=0.8, top_k=50, seed=3)
    )
    return result


@pytest.fixture(scope="module")
def references():
    model = make_model()
    return {
        length: (reference_greedy(model, prompt(length), N_NEW), reference_scores(model, prompt(length), CONTINUATIONS))
        for length in PROMPT_LENGTHS
    }


def test_one_process_matches_the_plain_loop(references):
    model = make_model()
    for length, (greedy, scores) in references.items():
        for chunk in (8192, 7):  # one prefill pass, or chunks of 7 tokens
            gen = Generator(model, VOCAB, prefill_chunk=chunk)
            assert gen.generate(prompt(length), GenerationConfig(max_new_tokens=N_NEW)) == greedy
            assert gen.score(prompt(length), CONTINUATIONS) == pytest.approx(scores, abs=1e-4)
    # the model gets its own attention back: a plain forward is unchanged
    ids = prompt(45)[None]
    torch.testing.assert_close(model(ids), make_model()(ids), rtol=0, atol=0)


@pytest.mark.parametrize("world,layouts", [(2, ("striped", "zigzag")), (4, ("striped", "zigzag"))])
def test_context_parallel_generation_is_exact(references, world, layouts):
    results = run_distributed(_worker, world, layouts)
    for rank_result in results:
        for layout in layouts:
            for length, (greedy, scores) in references.items():
                for kind in ("", "-seg"):
                    assert rank_result[layout, length, "greedy" + kind] == greedy, (world, layout, length, kind)
                    assert rank_result[layout, length, "score" + kind] == pytest.approx(scores, abs=1e-4)
    for layout in layouts:
        for length in PROMPT_LENGTHS:
            cached = [r[layout, length, "cache"] for r in results]
            assert sum(cached) == length + 5  # every token cached exactly once ...
            assert max(cached) - min(cached) <= 2  # ... spread evenly: no rank holds the whole cache
    assert all(r["sampled"] == results[0]["sampled"] for r in results)  # ranks agree on sampled tokens
    one = Generator(make_model(), VOCAB).generate(
        prompt(45), GenerationConfig(max_new_tokens=N_NEW, temperature=0.8, top_k=50, seed=3)
    )
    assert results[0]["sampled"] == one


def test_transformers_generate_on_the_exported_model(tmp_path, references):
    from transformers import AutoModelForCausalLM

    from lwm.interop.hf import to_hf

    model = make_model()
    to_hf(model, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    padding = list(range(VOCAB.used_size, VOCAB.size))
    for length, (greedy, _) in references.items():
        ids = prompt(length)[None]
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=N_NEW,
            do_sample=False,
            suppress_tokens=padding,
            pad_token_id=0,
            eos_token_id=None,
        )
        assert out[0, length:].tolist() == greedy


def test_sampling_options_stop_tokens_and_ranges(references):
    model = make_model()
    greedy = references[45][0]
    gen = Generator(model, VOCAB)
    assert gen.generate(prompt(45), GenerationConfig(max_new_tokens=N_NEW, temperature=1.0, top_k=1)) == greedy
    stop = greedy[4]
    cut = gen.generate(prompt(45), GenerationConfig(max_new_tokens=N_NEW, stop_tokens=[stop]))
    assert cut == greedy[: greedy.index(stop)]
    text = gen.generate(prompt(45), GenerationConfig(max_new_tokens=N_NEW, temperature=1.5, restrict="text", seed=1))
    assert all(t < VOCAB.text_size for t in text)
    vision = gen.generate(
        prompt(45), GenerationConfig(max_new_tokens=N_NEW, temperature=1.5, restrict="vision", seed=1)
    )
    assert all(VOCAB.vision_offset <= t < VOCAB.eof or t in (VOCAB.eof, VOCAB.eov, VOCAB.vision_end) for t in vision)
    a = gen.generate(prompt(45), GenerationConfig(max_new_tokens=N_NEW, temperature=1.0, seed=7))
    assert a == gen.generate(prompt(45), GenerationConfig(max_new_tokens=N_NEW, temperature=1.0, seed=7))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"top_k": 0}, "top_k must be >= 1"),
        ({"restrict": "audio"}, "restrict must be one of"),
        ({"temperature": float("nan")}, r"temperature must be >= 0 \(0 is greedy\) and finite, got nan"),
        ({"temperature": float("inf")}, "temperature must be >= 0 .* and finite, got inf"),
        ({"temperature": "0.5"}, "temperature must be"),
        ({"max_new_tokens": 2.5}, r"max_new_tokens must be >= 1 \(an integer\), got 2.5"),
        ({"top_k": True}, "top_k must be >= 1"),
        ({"seed": 2**64}, r"seed must be an integer in \[-2\*\*63, 2\*\*64\)"),
    ],
)
def test_bad_generation_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**kwargs)


@pytest.mark.parametrize("flushed", [False, True])
def test_a_tiny_temperature_tends_to_greedy_not_nan(references, flushed):
    """logits / 1e-40 overflowed float32 to inf, and softmax(inf - inf) gave nan: tokens drawn from garbage. With
    denormals flushed (a process that trained: trainer.flush_denormal) 1e-40 read as 0, and 0 / 0 gave nan."""
    gen = Generator(make_model(), VOCAB)
    torch.set_flush_denormal(flushed)
    try:
        tokens = gen.generate(prompt(45), GenerationConfig(max_new_tokens=N_NEW, temperature=1e-40))
    finally:
        torch.set_flush_denormal(False)
    assert tokens == references[45][0]


def test_bad_prompts():
    gen = Generator(make_model(), VOCAB)
    with pytest.raises(ValueError, match="the prompt is empty"):
        gen.generate([])
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 12352\)"):
        gen.generate([1, 99999])
    with pytest.raises(ValueError, match="vocabulary rows"):
        Generator(make_model(), Vocab(32000))


def test_command_one_process_and_torchrun(tmp_path, capsys):
    """lwm-generate on an exported model prints the same text with 1 process (in this one) and with
    2 (torchrun); a missing model is refused with exit 2."""
    import os
    import subprocess
    import sys

    from lwm.data.text_tokenizer import TextTokenizer
    from lwm.infer import cli
    from lwm.interop.hf import to_hf

    root = REPO
    tok = root / "data" / "sample" / "tokenizer.model"
    to_hf(make_model(), tmp_path / "hf", tokenizer_model=tok)
    text = "The red circle moves to the left while the"
    ids = [TextTokenizer(tok).bos_id, *TextTokenizer(tok).encode(text)]
    expected = Generator(make_model(), VOCAB).generate(
        ids, GenerationConfig(max_new_tokens=10, restrict="text", stop_tokens=[TextTokenizer(tok).eos_id])
    )
    args = ["--model", str(tmp_path / "hf"), "--prompt", text, "--raw", "--max-new-tokens", "10", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    assert cli.main(args) == 0
    one = capsys.readouterr().out.strip()
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "lwm.infer.cli",
    ]
    proc = subprocess.run(torchrun + args, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert one and one == proc.stdout.strip() == TextTokenizer(tok).decode(expected).strip()
    with pytest.raises(SystemExit) as refused:
        cli.main(["--model", str(tmp_path / "nope"), "--prompt", "x"])
    assert refused.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_cli_default_paths_work_from_any_folder_and_bad_paths_name_the_option(tmp_path, monkeypatch, capsys):
    """The bundled VQGAN is found from the package, not the working directory; a path that does not
    exist is a usage error (exit 2) naming its option, before any model loads."""
    from pathlib import Path

    from lwm.infer import cli

    root = REPO
    monkeypatch.syspath_prepend(str(root))
    from lwm.eval import video_qa

    monkeypatch.chdir(tmp_path)
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"")  # only its existence is checked before loading
    # Without --vqgan the model folder's VQGAN is used, else the bundled one (found from the package).
    args = cli.parse_args(["--model", str(tmp_path), "--prompt", "x", "--video", str(video)])
    assert args.vqgan is None and video_qa.build_parser().parse_args(["--model", "m", "--data", "d"]).vqgan is None
    assert Path(cli.TINY_VQGAN).is_absolute() and Path(cli.TINY_VQGAN).is_file()
    assert Path(cli.TINY_VQGAN) == root / "data" / "checkpoints" / "vqgan_tiny.safetensors"

    for argv, option in [
        (["--video", str(video), "--vqgan", "path/x"], "--vqgan path/x"),
        (["--video", "nope.mp4"], "--video nope.mp4"),
        (["--codes", "nope", "--video-id", "v"], "--codes nope"),
        (["--tokenizer", "nope.model"], "--tokenizer nope.model"),
    ]:
        with pytest.raises(SystemExit) as e:
            cli.main(["--model", str(tmp_path), "--prompt", "x", *argv])
        assert e.value.code == 2 and f"{option} does not exist" in capsys.readouterr().err, option
    # --vqgan is only needed to tokenize a video: without one a missing checkpoint is no error.
    assert cli.parse_args(["--model", str(tmp_path), "--prompt", "x", "--vqgan", "path/x"]).vqgan == "path/x"


# ------------------------------------------------------------------------------------ lwm-generate, in-process


@pytest.fixture
def stub_model(monkeypatch, tmp_path):
    """lwm-generate's model loading replaced by the debug model and the sample tokenizer (in this process)."""

    from lwm.data.text_tokenizer import TextTokenizer
    from lwm.infer import Loaded, cli

    tok = TextTokenizer(REPO / "data" / "sample" / "tokenizer.model")
    loaded = Loaded(make_model(), VOCAB, tok)
    monkeypatch.setattr(cli, "load_generator", lambda args, runtime: (loaded, Generator(loaded.model, VOCAB)))
    return loaded


def _cache(root, codes) -> tuple[str, str]:
    """An lwm-tokenize folder holding one video, v, with its checksum recorded as lwm-tokenize does."""
    import json

    from lwm.data.code_cache import save_codes

    (root / "tokens").mkdir(parents=True)
    with open(root / "tokens" / "v.npy", "wb") as f:
        sha256 = save_codes(f, codes)
    (root / "manifest.jsonl").write_text(json.dumps({"id": "v", "timestamps": [0.0], "sha256": sha256}) + "\n")
    return str(root), str(root / "tokens" / "v.npy")


def test_generate_refuses_a_changed_or_out_of_range_codes_file_naming_it(tmp_path, stub_model, capsys):
    import numpy as np

    from lwm.infer import cli

    argv = ["--model", str(tmp_path), "--prompt", "What?", "--max-new-tokens", "2", "--device", "cpu"]
    cache, path = _cache(tmp_path / "ok", np.full((1, 256), 7, np.uint16))
    assert cli.main([*argv, "--codes", cache, "--video-id", "v"]) == 0
    capsys.readouterr()
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0x01  # still a whole .npy, its codes still in range: only the checksum tells
    open(path, "wb").write(bytes(data))
    assert cli.main([*argv, "--codes", cache, "--video-id", "v"]) == 2
    err = capsys.readouterr().err
    assert f"cached codes {path} are not the file lwm-tokenize wrote" in err and "sha256" in err

    cache, path = _cache(tmp_path / "big", np.full((1, 256), 9000, np.uint16))  # past the 8192 codes
    assert cli.main([*argv, "--codes", cache, "--video-id", "v"]) == 2
    assert f"cached codes {path} hold codes in [9000, 9000]" in capsys.readouterr().err


def test_generate_warns_of_a_prompt_past_max_seq_len(tmp_path, stub_model, capsys):
    from lwm.infer import cli

    argv = ["--model", str(tmp_path), "--prompt", "Once upon a time", "--raw", "--max-new-tokens", "3"]
    assert cli.main([*argv, "--device", "cpu"]) == 0
    assert "max_seq_len" not in capsys.readouterr().err
    stub_model.model.config.max_seq_len = 5
    assert cli.main([*argv, "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "warning: the prompt (" in err and "with up to 3 new ones reaches" in err
    assert "longer than the model's max_seq_len 5" in err


def test_a_replaced_cache_is_freed_at_once_not_by_the_cycle_collector():
    """A second prompt's cache replaces the first; the first's tensors (and the process group it
    holds) go as soon as nothing refers to them. The layers once held their cache back, a cycle
    that only Python's cycle collector freed, at some later time: a whole KV cache of device memory
    kept while the next one was allocated, and a gloo group freed as the interpreter shut down,
    which aborted the process (torchrun: "terminate called without an active exception")."""
    import gc
    import weakref

    gen = Generator(make_model(), VOCAB)
    gc.disable()
    try:
        gen.prefill(prompt(45))
        first = weakref.ref(gen.cache.layers[0].cache.k)
        gen.prefill(prompt(64))
        assert first() is None
        kept = weakref.ref(gen.cache.layers[0].cache.k)
        gen.release()
        assert kept() is None
    finally:
        gc.enable()


def test_an_image_is_a_one_frame_video_for_generation(tmp_path, stub_model, monkeypatch, capsys):
    """lwm-generate --image: the prompt holds the image's one frame of codes, the tiny VQGAN's encoding of its
    center square (as lwm-tokenize makes it), where a video's frames go; CodeSource reads an image so for every
    command built on it (video QA, the lmms-eval model). --image with --video, or a file that is no image, is
    refused naming the option."""
    import numpy as np
    import torch
    from PIL import Image

    from lwm.data.chat import chat_prompt
    from lwm.infer import cli
    from lwm.interop.vqgan_sources import load_vqgan
    from lwm.paths import TINY_VQGAN
    from lwm.video.codes import CodeSource

    pixels = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "wide.png")
    vqgan = load_vqgan(TINY_VQGAN, preset="tiny")
    want = vqgan.encode(torch.from_numpy(np.ascontiguousarray(pixels[:, 16:80]))[None]).numpy()  # (1, 256)
    got = CodeSource(vqgan=vqgan, n_codes=8192).from_video(tmp_path / "wide.png")
    np.testing.assert_array_equal(got.codes, want)
    assert got.timestamps.tolist() == [0.0] and got.duration == 0.0

    seen = []
    monkeypatch.setattr(cli, "chat_prompt", lambda *a, **k: seen.append(a[3]) or chat_prompt(*a, **k))
    argv = ["--model", str(tmp_path), "--prompt", "What?", "--max-new-tokens", "2", "--device", "cpu"]
    assert cli.main([*argv, "--image", str(tmp_path / "wide.png")]) == 0
    np.testing.assert_array_equal(seen[0], want)
    for extra, message in (
        (
            ["--image", str(tmp_path / "wide.png"), "--video", str(tmp_path / "wide.png")],
            "give one of --video, --image",
        ),
        (["--image", str(tmp_path)], f"--image {tmp_path}: expected an image file"),
    ):
        with pytest.raises(SystemExit) as e:
            cli.main([*argv, *extra])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_inference_imports_no_training_parallelism():
    """lwm-generate's modules leave FSDP, DTensor and distributed checkpointing unimported (lwm.parallel's names
    load on first use): about a second of CPU for every inference process and loader worker."""
    import subprocess
    import sys

    code = "import sys, lwm.infer.cli, lwm.data.batches; print(sorted(m for m in HEAVY if m in sys.modules))"
    heavy = [
        "torch.distributed.fsdp",
        "torch.distributed.tensor",
        "torch.distributed.checkpoint",
        "lwm.parallel.tensor",
    ]
    out = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {heavy!r}; {code}"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", out
