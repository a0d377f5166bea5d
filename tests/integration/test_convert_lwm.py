"""lwm-convert-lwm on checkpoints written in LWM's format by the tests' own writer (tests/lwm_writers.py: tux's streaming
msgpack records, Flax's array encoding; scanned and unscanned layers, fp32 and bf16, chunked
records, params / trainstate load strings). The reference is an independent NumPy (float64)
forward written from LWM's lwm/llama.py and lwm/vision_llama.py: vision positions embedded with
vte, the rest with wte, RoPE on adjacent pairs via complex numbers, text and vision logits from the
same hidden state. Tolerances: fp32 logits atol 1e-5; greedy tokens equal.

Longer than most test files: one subject's tests kept together, beside the helpers they share.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from lwm_writers import CFG, TOKENIZER, bf16_round, random_params, scanned, write_lwm

from lwm.interop.convert_lwm import convert_lwm
from lwm.interop.lwm_jax import LWM_VISION_IDS, convert_params
from lwm.interop.lwm_params import LWMConfig, load_lwm_config, read_params
from lwm.model import Transformer
from lwm.paths import REPO

ROOT = REPO
# ---------------------------------------------------------------------------------------- LWM's forward, in NumPy


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, positions, theta):
    """x (S, H, hd): rotate each adjacent pair (2i, 2i+1) as one complex number."""
    hd = x.shape[-1]
    freqs = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    cis = np.exp(1j * np.outer(positions, freqs))[:, None, :]  # (S, 1, hd/2)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * cis
    return np.stack([z.real, z.imag], -1).reshape(x.shape)


def lwm_forward(p: dict, cfg: dict, ids: np.ndarray, vision: np.ndarray):
    """(S,) ids and vision mask -> (text logits (S, V), vision logits (S, Vv)), float64."""
    p = {k: v.astype(np.float64) for k, v in p.items()}
    D, H, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["rms_norm_eps"]
    hd, S = D // H, len(ids)
    x = np.where(
        vision[:, None],
        p["transformer/vte/embedding"][np.where(vision, ids, 0)] if vision.any() else 0.0,
        p["transformer/wte/embedding"][np.where(vision, 0, ids)],
    )
    causal = np.tril(np.ones((S, S), bool))
    for i in range(cfg["num_hidden_layers"]):
        w = lambda leaf: p[f"transformer/h/{i}/{leaf}"]  # noqa: E731
        h = _rms(x, w("attention_norm/kernel"), eps)
        q, k, v = ((h @ w(f"attention/{n}/kernel")).reshape(S, H, hd) for n in ("wq", "wk", "wv"))
        q, k = _rope(q, np.arange(S), cfg["theta"]), _rope(k, np.arange(S), cfg["theta"])
        att = np.einsum("shd,thd->hst", q, k) / np.sqrt(hd)
        att = np.where(causal, att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + np.einsum("hst,thd->shd", att, v).reshape(S, D) @ w("attention/wo/kernel")
        h = _rms(x, w("ffn_norm/kernel"), eps)
        g = h @ w("feed_forward/w1/kernel")
        x = x + (g / (1 + np.exp(-g)) * (h @ w("feed_forward/w3/kernel"))) @ w("feed_forward/w2/kernel")
    x = _rms(x, p["transformer/ln_f/kernel"], eps)
    return x @ p["lm_head/kernel"], (x @ p["vision_head/kernel"] if "vision_head/kernel" in p else None)


def lwm_greedy_text(p: dict, cfg: dict, ids: list[int], vision: list[bool], n: int) -> list[int]:
    """LWM's text sampling, greedy: argmax of the text logits, the whole sequence each step."""
    ids, vision, out = list(ids), list(vision), []
    for _ in range(n):
        text, _ = lwm_forward(p, cfg, np.array(ids), np.array(vision))
        out.append(int(text[-1].argmax()))
        ids.append(out[-1])
        vision.append(False)
    return out


def sample_sequence(cfg: dict, n_frames: int = 2, tokens_per_frame: int = 5, seed: int = 1):
    """LWM-form ids and vision mask: text, then frames of codes each closed by 8192 (8193 last), then text."""
    rng = np.random.default_rng(seed)
    ids, vision = list(rng.integers(3, cfg["vocab_size"], 7)), [False] * 7
    for f in range(n_frames):
        ids += list(rng.integers(0, 8192, tokens_per_frame)) + [8193 if f == n_frames - 1 else 8192]
        vision += [True] * (tokens_per_frame + 1)
    ids += list(rng.integers(3, cfg["vocab_size"], 4))
    vision += [False] * 4
    return np.array(ids), np.array(vision)


def ours(ids: np.ndarray, vision: np.ndarray, text_size: int) -> torch.Tensor:
    """LWM's (ids, vision mask) -> our ids: vision id c sits at text_size + c."""
    return torch.from_numpy(np.where(vision, text_size + ids, ids))[None]


def converted(params: dict, cfg: dict, **write) -> tuple[Transformer, list[str]]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = write_lwm(Path(tmp) / "params", params, **write)
        state, model_config, notes = convert_params(read_params(f"params::{path}"), load_lwm_config(cfg), torch.float32)
    with torch.device("meta"):
        model = Transformer(model_config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval(), notes


# ---------------------------------------------------------------------------------------- tests


def assert_logits_match(model, params, cfg, ids, vision, atol=1e-5):
    text_ref, vision_ref = lwm_forward(params, cfg, ids, vision)
    V = cfg["vocab_size"]
    with torch.no_grad():
        logits = model(ours(ids, vision, V))[0].double().numpy()  # (S, rows)
    np.testing.assert_allclose(logits[:, :V], text_ref, atol=atol, rtol=0)
    if vision_ref is not None:
        np.testing.assert_allclose(logits[:, V : V + LWM_VISION_IDS], vision_ref[:, :LWM_VISION_IDS], atol=atol, rtol=0)


@pytest.mark.parametrize(
    "layout,dtype,chunk_bytes",
    [
        ("scanned", "float32", 2**30),
        ("unscanned", "float32", 2**30),
        ("scanned", "bfloat16", 4096),
        ("unscanned", "bfloat16", 1000),
    ],
)
def test_converted_logits_equal_lwm_forward(layout, dtype, chunk_bytes):
    """Text and vision logits of the converted model equal LWM's forward (fp32, atol 1e-5); bf16
    checkpoints are compared with the reference on the bf16-rounded weights; chunk_bytes small enough
    that large leaves come as chunked records."""
    params = random_params(CFG)
    ref = bf16_round(params) if dtype == "bfloat16" else params
    stored = scanned(params, CFG["num_hidden_layers"]) if layout == "scanned" else params
    model, notes = converted(stored, CFG, dtype=dtype, chunk_bytes=chunk_bytes)
    ids, vision = sample_sequence(CFG)
    assert_logits_match(model, ref, CFG, ids, vision)
    assert "8194..8447" in notes[0] and "dropped" in notes[0]
    if chunk_bytes < 2**30:  # the chunked records really were chunked
        raw = open(
            write_lwm(
                Path(__import__("tempfile").mkdtemp()) / "p", {"x": params["lm_head/kernel"]}, dtype, chunk_bytes
            ),
            "rb",
        ).read()
        assert b"__msgpack_chunked_array__" in raw


def test_train_state_load_strings_and_scan_axis_1(tmp_path):
    """trainstate_params:: and trainstate:: read the parameters under params/params and skip the
    optimizer state and step; param_scan_axis 1 stacks layers on the second axis."""
    params = random_params(CFG)
    stacked = scanned(params, CFG["num_hidden_layers"])
    extra = {"opt_state/1/0/mu/lm_head/kernel": np.ones((3, 3), np.float32), "step": np.array(7, np.int32)}
    path = write_lwm(tmp_path / "trainstate", stacked, prefix=("params", "params"), extra=extra)
    for kind in ("trainstate_params", "trainstate"):
        names = [name for name, _ in read_params(f"{kind}::{path}")]
        assert names == list(stacked)
    axis1 = {k: (np.moveaxis(v, 0, 1) if "scan_decoder" in k else v) for k, v in stacked.items()}  # norms too: (D, L)
    model, _ = converted(axis1, {**CFG, "param_scan_axis": 1})
    ids, vision = sample_sequence(CFG, seed=3)
    assert_logits_match(model, params, CFG, ids, vision)


def test_text_only_checkpoint_is_a_plain_llama(tmp_path):
    """Without vte / vision_head the result keeps the text vocabulary (LWM-Text's Hugging Face form)."""
    params = random_params(CFG, vision=False)
    model, notes = converted(params, CFG)
    assert model.config.vocab_size == CFG["vocab_size"] and notes == []
    ids, vision = sample_sequence(CFG, n_frames=0)
    assert_logits_match(model, params, CFG, ids, vision)


def test_the_folder_loads_in_transformers_and_lwm_and_prompts_as_lwm_does(tmp_path):
    """The converted folder: AutoModelForCausalLM loads it with no missing or unexpected keys and
    gives our logits; AutoTokenizer loads; lwm.infer.load_model writes LWM's prompt, which is what
    LWM's vision_chat.py builds, piece by piece."""
    import sentencepiece as spm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lwm.data.chat import chat_prompt
    from lwm.infer.load import load_model

    params = random_params(CFG)
    path = write_lwm(tmp_path / "params", scanned(params, CFG["num_hidden_layers"]), dtype="bfloat16")
    out = convert_lwm(f"params::{path}", CFG, tmp_path / "hf", tokenizer=TOKENIZER, dtype=torch.float32)
    hf, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert all(not info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    loaded = load_model(out)
    assert loaded.prompt == "lwm" and loaded.vqgan is None
    ids, vision = sample_sequence(CFG)
    x = ours(ids, vision, CFG["vocab_size"])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, loaded.model(x), atol=1e-5, rtol=0)
    assert_logits_match(loaded.model, bf16_round(params), CFG, ids, vision)
    suppressed = hf.generation_config.suppress_tokens
    assert suppressed[0] == CFG["vocab_size"] and suppressed[-1] == loaded.model.config.vocab_size - 1

    # LWM's construct_input, with the tokenizer its released models were trained with: sentencepiece
    # pieces (its LLaMATokenizer, add_bos_token=False), the literal "<s>" read as the one BOS
    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))
    codes = np.random.default_rng(0).integers(0, 8192, (2, 256))
    vision_ids = [c for f, frame in enumerate(codes) for c in [*frame, 8193 if f == len(codes) - 1 else 8192]]
    question = "What is in the video?"
    expected = (
        [sp.bos_id()]
        + sp.encode(f"You are a helpful assistant. USER: {question}\n")
        + sp.encode("<vision>")
        + [CFG["vocab_size"] + c for c in vision_ids]
        + sp.encode("</vision>")
        + sp.encode(" ASSISTANT:")
    )
    assert chat_prompt(loaded.tokenizer, loaded.vocab, question, codes, style=loaded.prompt) == expected
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.encode("<vision>", add_special_tokens=False) == sp.encode("<vision>")  # the markers stay text
    assert tok.convert_tokens_to_ids(["<vision_5>", "<eof>", "<eov>"]) == [
        CFG["vocab_size"] + c for c in (5, 8192, 8193)
    ]


def _cp_greedy(rank: int, world: int, folder: str, prompt: list[int], n: int) -> list[int]:
    import torch.distributed as dist

    from lwm.infer import GenerationConfig, Generator
    from lwm.infer.load import load_model

    loaded = load_model(folder)
    gen = Generator(loaded.model, loaded.vocab, group=dist.group.WORLD)
    return gen.generate(prompt, GenerationConfig(max_new_tokens=n, restrict="text"))


def test_greedy_text_generation_equals_lwm_with_cp_1_and_2(tmp_path):
    """Greedy text generation on the converted model (restricted to text, as LWM samples text from
    its text head) equals LWM's, over a prompt with video, on one process and split over two."""
    from lwm.infer import GenerationConfig, Generator
    from lwm.infer.load import load_model
    from lwm.parallel.launch import run_distributed

    params = random_params(CFG, seed=5)
    path = write_lwm(tmp_path / "params", scanned(params, CFG["num_hidden_layers"]))
    out = convert_lwm(f"params::{path}", CFG, tmp_path / "hf", tokenizer=TOKENIZER)
    ids, vision = sample_sequence(CFG, n_frames=3, seed=7)
    expected = lwm_greedy_text(params, CFG, ids.tolist(), vision.tolist(), 8)
    prompt = ours(ids, vision, CFG["vocab_size"])[0].tolist()
    loaded = load_model(out)
    assert (
        Generator(loaded.model, loaded.vocab).generate(prompt, GenerationConfig(max_new_tokens=8, restrict="text"))
        == expected
    )
    assert run_distributed(_cp_greedy, 2, str(out), prompt, 8) == [expected, expected]


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda p: p.pop("transformer/h/1/ffn_norm/kernel"), r"lacks 1 parameters: \['layers\.1\.mlp_norm\.weight'\]"),
        (
            lambda p: p.update({"transformer/h/0/attention/wq/bias": np.zeros(32, np.float32)}),
            "transformer/h/0/attention/wq/bias: not a parameter of LWM's",
        ),
        (
            lambda p: p.update({"lm_head/kernel": np.zeros((32, 4000), np.float32)}),
            r"lm_head/kernel: shape \(32, 4000\) in the checkpoint, but the config .* gives \(32, 4096\)",
        ),
        (
            lambda p: p.update({"transformer/h/2/ffn_norm/kernel": np.ones(32, np.float32)}),
            "layer 2, but the config has num_hidden_layers 2",
        ),
    ],
)
def test_bad_checkpoints_are_named(tmp_path, change, message):
    params = random_params(CFG)
    change(params)
    with pytest.raises(ValueError, match=message):
        converted(params, CFG)


def test_bad_inputs_fail_before_work(tmp_path, capsys):
    from lwm.interop.convert_lwm import main

    params = write_lwm(tmp_path / "params", random_params(CFG, vision=False))
    (tmp_path / "junk").write_bytes(b"\xc1" * 64)
    (tmp_path / "cfg.json").write_text('{"hidden_size": 32}')
    cases = [
        (["--checkpoint", f"weights::{params}", "--config", "7b"], "unknown load type 'weights'"),
        (["--checkpoint", f"params::{tmp_path / 'nope'}", "--config", "7b"], "does not exist"),
        (["--checkpoint", f"params::{tmp_path / 'junk'}", "--config", "7b"], "is not an LWM streaming checkpoint"),
        (["--checkpoint", f"params::{params}", "--config", "70b"], "neither one of LWM's presets"),
        (["--checkpoint", f"params::{params}", "--config", str(tmp_path / "cfg.json")], "lacks ['intermediate_size'"),
        (["--checkpoint", f"params::{params}", "--config", "7b"], "shape (4096, 32) in the checkpoint"),
        (
            ["--checkpoint", f"params::{params}", "--config", "debug", "--tokenizer", str(TOKENIZER)],
            "has 4096 ids but the config's vocab_size is 32000",
        ),
    ]
    for argv, message in cases:
        assert main(argv + ["--out", str(tmp_path / "out")]) == 2, argv
        assert message in capsys.readouterr().err, (argv, message)
    with pytest.raises(SystemExit):
        main(["--checkpoint", f"params::{params}", "--config", "7b", "--out", str(tmp_path / "o"), "--vqgan", "nope"])
    assert "--vqgan nope does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_out_with_other_files_is_refused_and_a_rerun_replaces_its_own(tmp_path, capsys):
    """lwm-convert-lwm writes beside --out and moves in only what it made: a folder holding files named like
    another model's shards is refused before the conversion (they were deleted before); its own earlier
    conversion is replaced."""
    import json

    from lwm.interop.convert_lwm import main

    params = write_lwm(tmp_path / "params", random_params(CFG, vision=False))
    (tmp_path / "cfg.json").write_text(json.dumps(CFG))
    out = tmp_path / "out"
    out.mkdir()
    (out / "model-00001-of-00003.safetensors").write_bytes(b"someone's")
    argv = ["--checkpoint", f"params::{params}", "--config", str(tmp_path / "cfg.json"), "--out", str(out)]
    assert main(argv) == 2
    assert "holds files an export did not make (model-00001-of-00003.safetensors)" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["model-00001-of-00003.safetensors"]
    assert (out / "model-00001-of-00003.safetensors").read_bytes() == b"someone's"
    (out / "model-00001-of-00003.safetensors").unlink()
    assert main(argv) == 0 and main(argv) == 0  # the second replaces the first's files
    assert (out / "lwm_files.json").is_file() and not list(tmp_path.glob(".out.*"))


def test_lwm_presets_are_lwms_shapes():
    seven = load_lwm_config("7b")
    assert (seven.hidden_size, seven.intermediate_size, seven.num_hidden_layers, seven.num_attention_heads) == (
        4096,
        11008,
        32,
        32,
    )
    assert isinstance(load_lwm_config({**CFG}), LWMConfig)


def test_one_folder_with_the_vqgan_serves_generation_and_video_qa(tmp_path, capsys):
    """--vqgan puts LWM's VQGAN into DIR/vqgan as a diffusers VQModel; load_model finds it, and
    lwm-generate and lwm/eval/video_qa/ answer about a video file from DIR alone, with LWM's prompt."""
    import json
    import pickle

    from diffusers import VQModel
    from lwm_writers import SMALL, lwm_params
    from video_samples import write_video

    from lwm.data.chat import chat_prompt
    from lwm.eval.video_qa import main as video_qa_main
    from lwm.infer.cli import build_parser, prompt_ids
    from lwm.infer.cli import main as generate_main
    from lwm.infer.load import load_model
    from lwm.interop.diffusers import from_diffusers
    from lwm.interop.lwm_vqgan import from_lwm_vqgan
    from lwm.video.codes import video_codes

    vq_pickle = tmp_path / "vqgan"
    vq_pickle.write_bytes(pickle.dumps(lwm_params(**SMALL, rng=np.random.default_rng(0))))
    path = write_lwm(tmp_path / "params", scanned(random_params(CFG), CFG["num_hidden_layers"]))
    out = convert_lwm(f"params::{path}", CFG, tmp_path / "hf", vqgan=vq_pickle, tokenizer=TOKENIZER)
    VQModel.from_pretrained(out / "vqgan")  # diffusers reads it
    frames = torch.rand(2, 3, 32, 32) * 2 - 1
    assert torch.equal(from_diffusers(out / "vqgan").encode(frames), from_lwm_vqgan(vq_pickle).encode(frames))
    loaded = load_model(out)
    assert loaded.prompt == "lwm" and loaded.vqgan == out / "vqgan"
    assert json.loads((out / "lwm.json").read_text())["vqgan"] == "vqgan"

    clip = write_video(tmp_path / "clip.mp4", width=40, height=32, frames=30, fps=10)
    args = ["--model", str(out), "--video", str(clip), "--prompt", "What moves?", "--device", "cpu"]
    codes = video_codes(clip, from_lwm_vqgan(vq_pickle), fps=1.0)
    assert codes.shape == (3, 256)
    assert prompt_ids(build_parser().parse_args(args), loaded) == chat_prompt(
        loaded.tokenizer, loaded.vocab, "What moves?", codes, style="lwm"
    )
    native = prompt_ids(build_parser().parse_args(args + ["--prompt-style", "native"]), loaded)
    assert loaded.vocab.vision_start in native and loaded.vocab.vision_start not in prompt_ids(
        build_parser().parse_args(args), loaded
    )
    assert generate_main(args + ["--max-new-tokens", "3"]) == 0
    (tmp_path / "qa.jsonl").write_text(
        json.dumps(
            {
                "video": str(clip),
                "question": "What moves?",
                "options": ["A circle.", "A square."],
                "answer": "A circle.",
            }
        )
        + "\n"
    )
    assert (
        video_qa_main(
            [
                "--model",
                str(out),
                "--data",
                str(tmp_path / "qa.jsonl"),
                "--out",
                str(tmp_path / "eval"),
                "--device",
                "cpu",
                "--no-progress",
                "--methods",
                "ll",
            ]
        )
        == 0
    )
    record = json.loads((tmp_path / "eval" / "video_qa.json").read_text())["records"][0]
    assert record["error"] is None and record["prompt_tokens"] == len(
        prompt_ids(build_parser().parse_args(args), loaded)
    )
    capsys.readouterr()


def test_export_bundles_a_runs_vqgan(tmp_path):
    """python -m lwm.train.export --vqgan puts the run's VQGAN beside the weights; prompts stay native."""
    from lwm.infer.load import load_model
    from lwm.interop.vqgan_sources import load_vqgan
    from lwm.model import ModelConfig
    from lwm.train.export import export_weights

    model = Transformer(ModelConfig.from_preset("debug", vocab_size=12352))
    vqgan = ROOT / "data" / "checkpoints" / "vqgan_tiny.safetensors"
    out = export_weights(model.state_dict(), model.config, tmp_path / "hf", TOKENIZER, vqgan=vqgan)
    loaded = load_model(out)
    assert loaded.prompt == "native" and loaded.vqgan == out / "vqgan"
    bundled, original = load_vqgan(loaded.vqgan), load_vqgan(vqgan)
    frames = torch.rand(1, 3, original.config.resolution, original.config.resolution) * 2 - 1
    assert torch.equal(bundled.encode(frames), original.encode(frames))


def test_a_runs_export_finds_the_vqgan_that_made_its_codes(tmp_path, capsys):
    """codes_vqgan reads the VQGAN from the code store's manifest (lwm-tokenize records it), and only
    while its file still holds the weights that made the codes."""
    import json

    from lwm.interop.vqgan_sources import load_vqgan
    from lwm.train.export import codes_vqgan
    from lwm.vision.checkpoint import weights_hash

    vqgan = ROOT / "data" / "checkpoints" / "vqgan_tiny.safetensors"
    made_by = {"preset": "tiny", "checkpoint": str(vqgan), "weights": weights_hash(load_vqgan(vqgan))}
    for name, tokenizer, expected in (
        ("same", made_by, vqgan),
        ("changed", {**made_by, "weights": "0" * 16}, None),
        ("gone", {**made_by, "checkpoint": str(tmp_path / "nope.safetensors")}, None),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.jsonl").write_text(json.dumps({"id": "v", "tokenizer": tokenizer}) + "\n")
        assert codes_vqgan(tmp_path / name) == expected, name
    assert "no longer holds the weights" in capsys.readouterr().out


def test_a_text_only_folder_runs_in_lwm_generate_with_lwms_text_chat_form(tmp_path):
    """A text-only LLaMA folder (LWM-Text's Hugging Face form; here converted from a text checkpoint)
    loads with zero vision rows: its text logits stay LWM's, greedy text generation is LWM's, and
    --prompt-style lwm writes LWM's text chat prompt as the folder's Hugging Face tokenizer encodes it."""
    from transformers import AutoTokenizer

    from lwm.infer import GenerationConfig, Generator
    from lwm.infer.cli import build_parser, prompt_ids
    from lwm.infer.load import load_model

    params = random_params(CFG, vision=False, seed=2)
    out = convert_lwm(f"params::{write_lwm(tmp_path / 'params', params)}", CFG, tmp_path / "hf", tokenizer=TOKENIZER)
    assert not (out / "vqgan").exists()
    loaded = load_model(out)
    assert loaded.model.config.vocab_size == loaded.vocab.size and loaded.prompt == "lwm"
    ids, vision = sample_sequence(CFG, n_frames=0, seed=4)
    assert_logits_match(loaded.model, params, CFG, ids, vision)
    argv = ["--model", str(out), "--prompt", "Where is the key?"]
    text_chat = AutoTokenizer.from_pretrained(out).encode(
        "You are a helpful assistant. USER: Where is the key? ASSISTANT:"
    )
    assert text_chat[0] == 1 and text_chat.count(1) == 1  # one BOS, as LWM's text chat
    assert prompt_ids(build_parser().parse_args(argv + ["--prompt-style", "lwm"]), loaded) == text_chat
    assert prompt_ids(build_parser().parse_args(argv), loaded) == text_chat  # auto: the folder's lwm.json
    got = Generator(loaded.model, loaded.vocab).generate(text_chat, GenerationConfig(max_new_tokens=6, restrict="text"))
    assert got == lwm_greedy_text(params, CFG, text_chat, [False] * len(text_chat), 6)


def test_zero_copy_msgpack_decoder_reads_what_msgpack_writes():
    """lwm.interop.msgpack_view.decode against msgpack's own encoder, over every type and width."""
    from lwm.interop.msgpack_view import Ext, MsgpackError, decode

    def plain(x):  # memoryviews and Ext -> what msgpack.unpackb returns
        if isinstance(x, memoryview):
            return bytes(x)
        if isinstance(x, Ext):
            return msgpack.ExtType(x.code, bytes(x.data))
        if isinstance(x, list):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {plain(k): plain(v) for k, v in x.items()}
        return x

    ints = [
        0,
        1,
        127,
        128,
        255,
        256,
        65535,
        65536,
        2**32 - 1,
        2**32,
        2**64 - 1,
        -1,
        -32,
        -33,
        -128,
        -129,
        -32768,
        -32769,
        -(2**31),
        -(2**31) - 1,
        -(2**63),
    ]
    objects = [
        None,
        True,
        False,
        1.5,
        -2.25e300,
        "",
        "x" * 31,
        "y" * 32,
        "z" * 300,
        "ü" * 40000,
        b"",
        b"a" * 255,
        b"b" * 256,
        b"c" * 70000,
        list(range(15)),
        list(range(16)),
        list(range(70000)),
        {str(k): k for k in range(15)},
        {str(k): [k] for k in range(16)},
        {"a": {"b": {"c": [b"d", None]}}},
        *[msgpack.ExtType(5, b"e" * n) for n in (1, 2, 4, 8, 16, 3, 255, 256, 70000)],
        *ints,
    ]
    for obj in objects:
        packed = msgpack.packb(obj, use_bin_type=True)
        value, end = decode(memoryview(packed))
        assert plain(value) == msgpack.unpackb(packed, raw=False, strict_map_key=False) and end == len(packed)
    with pytest.raises(MsgpackError, match="0xc1"):
        decode(memoryview(b"\xc1"))
    with pytest.raises(IndexError):
        decode(memoryview(msgpack.packb(b"f" * 100))[:50])
