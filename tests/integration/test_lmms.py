"""lmms-eval runs lwm: `python -m lmms_eval --model lwm` (lwm/eval/lmms.py, found through its entry point)
on a local copy of lmms-eval's own Video-MME task (its yaml, the dataset pointed at a local parquet in the
release's columns; lmms-eval's prompt, answer extraction and metric), offline, with the random-weight debug
model. Its answers are lwm's own greedy answers for the same prompt and frames (lwm.infer on the codes
lwm.eval.video_qa reads), and its multiple-choice scores are lwm's log-likelihoods of the choices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from video_samples import write_video  # noqa: E402

from lwm.data.chat import chat_prompt  # noqa: E402
from lwm.paths import REPO  # noqa: E402

ROOT = REPO

SPM = ROOT / "data" / "sample" / "tokenizer.model"
VQGAN = ROOT / "data" / "checkpoints" / "vqgan_tiny.safetensors"
FPS, MAX_FRAMES = 2.0, 3
OPTIONS = ["A. A red circle.", "B. A blue square.", "C. Two shapes.", "D. Nothing moves."]


def task_yaml(builtin: Path, name: str, parquet: Path, multiple_choice: bool) -> str:
    """lmms-eval's videomme.yaml with its dataset pointed at a local parquet, under another name (a task
    named videomme would be lmms-eval's own, which reads the Hub); its functions stay lmms-eval's."""
    lines = []
    for line in builtin.read_text().splitlines():
        if line.startswith(("dataset_path:", "  token:", "  cache_dir:", "  video:", "task:")):
            continue
        if line.startswith("dataset_kwargs:"):
            line = f"dataset_kwargs:\n  data_files:\n    test: {parquet}"
        lines.append(line.replace("!function utils.", "!function lmms_eval.tasks.videomme.utils."))
    text = "\n".join([f"task: {name}", "dataset_path: parquet", *lines]) + "\n"
    if multiple_choice:  # scored by the log-likelihood of each letter
        text = text.replace(
            "output_type: generate_until", 'output_type: multiple_choice\ndoc_to_choice: ["A", "B", "C", "D"]'
        )
        head, _, rest = text.partition("process_results:")
        _, _, tail = rest.partition("lmms_eval_specific_kwargs:")
        acc = "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        text = head + acc + "lmms_eval_specific_kwargs:" + tail
    return text


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import lmms_eval

    from lwm.data.text_tokenizer import TextTokenizer
    from lwm.data.vocab import Vocab
    from lwm.interop.hf import to_hf
    from lwm.model import ModelConfig, Transformer

    root = tmp_path_factory.mktemp("lmms")
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug", vocab_size=Vocab(TextTokenizer(SPM).vocab_size).size))
    to_hf(model, root / "hf", tokenizer_model=SPM)
    videos = (
        root / "hf_home" / "videomme" / "data"
    )  # where lmms-eval's Video-MME functions look: $HF_HOME/videomme/data
    videos.mkdir(parents=True)
    rows = []
    for i, vid in enumerate(["vidA", "vidB"]):
        write_video(videos / f"{vid}.mp4", width=64, height=64, frames=12 + 6 * i, fps=6)
        for q in range(2):
            rows.append(
                {
                    "video_id": f"00{i}",
                    "duration": "short",
                    "domain": "Knowledge",
                    "sub_category": "Literature & Art",
                    "url": f"https://example.com/{vid}",
                    "videoID": vid,
                    "question_id": f"00{i}-{q}",
                    "task_type": "Attribute Perception",
                    "question": f"What is shown in the video? ({q})",
                    "options": OPTIONS,
                    "answer": "ABCD"[(i + q) % 4],
                }  # fmt: skip
            )
    pq.write_table(pa.Table.from_pylist(rows), root / "test.parquet")
    builtin = Path(lmms_eval.__file__).parent / "tasks" / "videomme" / "videomme.yaml"
    (root / "tasks").mkdir()
    for name, mc in (("lwm_videomme_local", False), ("lwm_videomme_local_mc", True)):
        (root / "tasks" / f"{name}.yaml").write_text(task_yaml(builtin, name, root / "test.parquet", mc))
    return {"root": root, "rows": rows, "videos": videos}


TASKS = ("lwm_videomme_local", "lwm_videomme_local_mc")  # run by one process for the one-process tests


def run_lmms_eval(setup, task: str, extra: str = "", log: list | None = None) -> tuple[dict, list[dict]]:
    """`python -m lmms_eval` with the lwm model on a task: (results, samples by doc_id). A run is made once
    per module, one-process runs of both tasks by one command (as lmms-eval runs a list of tasks): the tests
    that compare with one process's run share it."""
    runs = setup.setdefault("runs", {})
    tasks = TASKS if not extra and task in TASKS else (task,)
    if (tasks, extra) not in runs:
        runs[tasks, extra] = _run_lmms_eval(setup, tasks, extra)
    output, results, samples = runs[tasks, extra]
    if log is not None:
        log.append(output)
    return results, samples[task]


def _run_lmms_eval(setup, tasks: tuple[str, ...], extra: str) -> tuple[str, dict, dict[str, list[dict]]]:
    root = setup["root"]
    out = root / f"out_{'_'.join(tasks)}{''.join(c for c in extra if c.isalnum())}"
    env = {**os.environ, "HF_HOME": str(root / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    args = f"pretrained={root / 'hf'},vqgan={VQGAN},fps={FPS},max_frames={MAX_FRAMES},device=cpu{extra}"
    cmd = [sys.executable, "-m", "lmms_eval", "--model", "lwm", "--model_args", args, "--tasks", ",".join(tasks)]
    cmd += ["--include_path", str(root / "tasks"), "--batch_size", "1", "--output_path", str(out), "--log_samples"]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    found = list(out.rglob("*_results.json"))  # lmms-eval logs an error and exits 0: no results file says it
    assert proc.returncode == 0 and found, (proc.stdout + proc.stderr)[-4000:]
    results = json.loads(found[0].read_text())
    samples = {}
    for task in tasks:
        rows = [json.loads(line) for line in next(out.rglob(f"*_samples_{task}.jsonl")).read_text().splitlines()]
        samples[task] = sorted(rows, key=lambda s: int(s["doc_id"]))
    return proc.stdout + proc.stderr, results, samples


def lwm_reference(setup):
    """lwm's own pieces, not the adapter: the model loaded by lwm.infer, the codes lwm.eval.video_qa reads,
    the chat prompt; a function of (video, text) -> (prompt ids, generator, tokenizer)."""
    from lwm.eval.video_qa.items import Item
    from lwm.eval.video_qa.videos import VideoSource
    from lwm.infer.generator import Generator
    from lwm.infer.load import load_model

    loaded = load_model(str(setup["root"] / "hf"), device="cpu")
    generator = Generator(loaded.model, loaded.vocab)
    source = VideoSource(None, VQGAN, fps=FPS, max_frames=MAX_FRAMES, n_codes=loaded.vocab.n_vision_codes)

    def prompt(video: str, text: str) -> list[int]:
        codes, _ = source.load(Item(id=video, video=str(setup["videos"] / f"{video}.mp4"), video_key=video))
        return chat_prompt(loaded.tokenizer, loaded.vocab, text, codes, style=loaded.prompt)

    return prompt, generator, loaded.tokenizer


def test_lmms_eval_generates_what_lwm_generates(setup):
    """generate_until: lmms-eval's Video-MME prompt and video, lwm's greedy answer (16 tokens, cut at the
    task's stop), and lmms-eval's own score of it."""
    from lmms_eval.tasks.videomme.utils import extract_characters_regex, videomme_doc_to_text

    from lwm.infer.sampling import GenerationConfig

    results, samples = run_lmms_eval(setup, "lwm_videomme_local")
    prompt, generator, tokenizer = lwm_reference(setup)
    kwargs = {"post_prompt": "\nAnswer with the option's letter from the given choices directly."}
    correct = []
    assert [int(s["doc_id"]) for s in samples] == list(range(len(setup["rows"])))
    for sample, row in zip(samples, setup["rows"]):
        text = videomme_doc_to_text(row, kwargs)
        assert sample["input"] == text  # lmms-eval's own Video-MME prompt
        ids = generator.generate(
            prompt(row["videoID"], text),
            GenerationConfig(max_new_tokens=16, stop_tokens=[tokenizer.eos_id], restrict="text"),
        )
        want = tokenizer.decode(ids).split("\n\n")[0]
        got = sample["filtered_resps"]
        got = got[0] if isinstance(got, list) else got
        assert got == want and len(want) > 0, (sample["doc_id"], got, want)
        correct.append(extract_characters_regex(want) == row["answer"])
    score = results["results"]["lwm_videomme_local"]["videomme_perception_score,none"]
    assert score == pytest.approx(100 * sum(correct) / len(correct))


def test_lmms_eval_multiple_choice_scores_are_lwm_log_likelihoods(setup):
    """loglikelihood: each letter's score is lwm's negative log-likelihood of " A", " B", ... after the
    prompt; acc is lmms-eval's (the smallest)."""
    from lmms_eval.tasks.videomme.utils import videomme_doc_to_text

    results, samples = run_lmms_eval(setup, "lwm_videomme_local_mc")
    prompt, generator, tokenizer = lwm_reference(setup)
    kwargs = {"post_prompt": "\nAnswer with the option's letter from the given choices directly."}
    hits = []
    for sample, row in zip(samples, setup["rows"]):
        ids = prompt(row["videoID"], videomme_doc_to_text(row, kwargs))
        want = [-s for s in generator.score(ids, [tokenizer.encode(" " + letter) for letter in "ABCD"])]
        assert sample["input"] == videomme_doc_to_text(row, kwargs)
        got = [float(loss) for loss, _greedy in sample["filtered_resps"]]  # (loss, is_greedy) per letter
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5), (sample["doc_id"], got, want)
        hits.append("ABCD"[min(range(4), key=want.__getitem__)] == row["answer"])
    assert results["results"]["lwm_videomme_local_mc"]["acc,none"] == pytest.approx(sum(hits) / len(hits))


def test_lmms_eval_with_cp_2_prefills_each_prompt_over_two_ranks(setup):
    """model_args cp=2: lmms-eval runs as one process, the model starts two ranks, and every request's
    prompt is prefilled over both (a ring over two ranks: both must make each call, or the run hangs); the
    multiple-choice scores (score and generate) equal one process's within 1e-4, and the run ends with its
    ranks (the test waits for every process holding lmms-eval's output)."""
    log = []
    _, one = run_lmms_eval(setup, "lwm_videomme_local_mc")
    results, two = run_lmms_eval(setup, "lwm_videomme_local_mc", ",cp=2", log)
    assert "context parallel over 2 ranks" in log[0]
    for a, b in zip(one, two, strict=True):
        got, want = ([float(x) for x, _ in s["filtered_resps"]] for s in (b, a))
        assert got == pytest.approx(want, rel=1e-4, abs=1e-4) and [g for _, g in b["filtered_resps"]] == [
            g for _, g in a["filtered_resps"]
        ]
    assert "acc,none" in results["results"]["lwm_videomme_local_mc"]


def test_cp_ranks_are_refused_under_a_launcher(monkeypatch):
    from lwm.infer.runtime import ModelOptions
    from lwm.infer.spawned import start_ranks

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="cp=2 starts its own 2 ranks from one process: run the host as one process"):
        start_ranks(ModelOptions(model="unused"), 2, "cpu")


def test_the_entry_point_names_the_model():
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="lmms_eval.models") if ep.name == "lwm"]
    manifest = ep.load()()
    assert (manifest.model_id, manifest.simple_class_path) == ("lwm", "lwm.eval.lmms.LWM")


def test_an_image_task_gets_the_picture_as_a_one_frame_video(setup):
    """Image benchmarks hand the model a PIL image (doc_to_visual): its prompt is lwm's chat prompt over the
    picture's one frame of codes, as lwm-tokenize encodes the same picture saved to a file; an image file's
    path gives the same prompt; two visuals are refused naming the doc."""
    import numpy as np
    from lmms_eval.api.instance import Instance
    from PIL import Image

    from lwm.eval.lmms import LWM
    from lwm.interop.vqgan_sources import load_vqgan
    from lwm.video.image import encode_image

    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8))
    picture.save(setup["root"] / "picture.png")
    model = LWM(pretrained=str(setup["root"] / "hf"), vqgan=str(VQGAN), device="cpu")
    visuals = {0: [picture], 1: [str(setup["root"] / "picture.png")], 2: [picture, picture]}
    model.task_dict = {"images": {"test": {i: {} for i in visuals}}}

    def prompt(doc_id):
        args = ("What is it?", {}, lambda doc, i=doc_id: visuals[i], doc_id, "images", "test")
        request = Instance("generate_until", args, idx=0, metadata={"task": "images", "doc_id": doc_id, "repeats": 1})
        return model._prompt(request, "What is it?")[0]

    codes = encode_image(setup["root"] / "picture.png", load_vqgan(VQGAN, preset="tiny"))[0]
    want = chat_prompt(model.tokenizer, model.vocab, "What is it?", codes, style="native")
    assert prompt(0) == want and prompt(1) == want
    with pytest.raises(ValueError, match="images doc 2: lwm answers about one video or image"):
        prompt(2)
