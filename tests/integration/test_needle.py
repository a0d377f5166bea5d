"""lwm/eval/needle.py: needles land at sentence breaks at the requested depths, prompts have exactly the
requested length (and equal chat_prompt of their text), scoring, multi-needle bookkeeping, stub
generators that always / never answer, failures recorded, and the command (one process, torchrun,
bad input) on a random-weight model exported to a Hugging Face folder.

Longer than most test files: one subject's tests kept together, beside the helpers they share.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tables import squeeze
from train_runs import forked_command

from lwm.data.chat import chat_prompt
from lwm.data.text_tokenizer import TextTokenizer
from lwm.data.vocab import Vocab
from lwm.eval import needle as nd
from lwm.eval import needle_grid as ng
from lwm.eval.plots import color_at, grid_table, heatmap, human_count
from lwm.infer.runtime import ModelOptions
from lwm.paths import REPO
from lwm.synth import make_sample
from lwm.synth import needle_prompts as prompts

ROOT = REPO

TOKENIZER = ROOT / "data" / "sample" / "tokenizer.model"
TEXT = ROOT / "data" / "sample" / "text.jsonl"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return TextTokenizer(TOKENIZER)


@pytest.fixture(scope="module")
def sample_text() -> Path:
    """data/sample/text.jsonl, the commands' default haystack (the suite makes data/sample as it starts:
    tests/conftest.py)."""
    return TEXT


def write_haystack(path: Path, n_sentences: int = 400, seed: int = 0) -> Path:
    """Plain sentences of varied length in paragraphs (no 7-digit numbers)."""
    rng = random.Random(seed)
    words = "red green blue circle square river stone lamp window garden old quiet small bright".split()
    sentences = []
    for i in range(n_sentences):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(3, 14)))
        sentences.append(f"Line {i} was {body}.")
    paragraphs = [" ".join(sentences[k : k + 6]) for k in range(0, n_sentences, 6)]
    path.write_text("\n\n".join(paragraphs))
    return path


@pytest.fixture(scope="module")
def hay_file(tmp_path_factory) -> Path:
    return write_haystack(tmp_path_factory.mktemp("hay") / "hay.txt")


@pytest.fixture(scope="module")
def hay(tok, hay_file) -> prompts.Haystack:
    return prompts.Haystack.from_file(tok, hay_file, 6000)


def prompt_for(tok, hay, length, depth, n=1, ask=1, seed=0):
    items = prompts.make_needles(random.Random(seed), depth, n, ask)
    return prompts.build_prompt(tok, hay, length, items, prompts.question_for(items))


# --- insertion -------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [300, 1000])
def test_needle_at_sentence_breaks_and_requested_depths(tok, hay, length):
    word, end = prompts.piece_classes(tok)
    for depth in (0, 10, 25, 50, 75, 90, 100):
        p = prompt_for(tok, hay, length, depth)
        needle = p.needles[0]
        nid = tok.encode(needle.text)
        assert p.ids[needle.position : needle.position + len(nid)] == nid
        n_hay = len(p.ids) - len(nid) - (p.context.start) - (len(p.ids) - p.context.stop)
        if depth == 0:
            assert needle.position == p.context.start and needle.placed_depth == 0  # the very start
            assert p.user_text(tok).startswith(needle.text)
        elif depth == 100:
            assert needle.position + len(nid) == p.context.stop and needle.placed_depth == 100  # the very end
        else:  # after a sentence's end (or at the start when no sentence ends before the point)
            if needle.offset:
                assert end[p.ids[needle.position - 1]], "the needle follows a sentence's end"
                assert f". {needle.text} " in p.user_text(tok)
            assert word[p.ids[needle.position + len(nid)]], "and a new word follows it"
            # moved back to the sentence break before the requested point, never past it
            assert needle.placed_depth <= depth
            gap = (depth - needle.placed_depth) / 100 * n_hay  # tokens between the point and the break
            assert gap < 64, (depth, needle.placed_depth)
        assert p.user_text(tok).index(needle.text) >= 0


def test_needle_text_and_question(tok, hay):
    p = prompt_for(tok, hay, 400, 50)
    n = p.needles[0]
    assert n.text == f"The special magic {n.city} number is: {n.number}."
    assert p.question == f"What is the special magic {n.city} number?"
    assert 1_000_000 <= n.number <= 9_999_999
    assert p.user_text(tok).endswith(f"{p.question} {prompts.INSTRUCTION}")


# --- length ----------------------------------------------------------------------------------------


def test_prompt_has_exactly_the_requested_length_and_is_the_chat_prompt(tok, hay):
    vocab = Vocab(tok.vocab_size)
    shortest = prompts.min_length(tok)
    for length in (shortest, shortest + 1, 257, 1000, 3001, 5000):
        for depth in (0, 33, 100):
            for n, ask in ((1, 1), (3, 2)):
                if length < prompts.min_length(tok, n, ask):
                    continue
                p = prompt_for(tok, hay, length, depth, n, ask, seed=length)
                assert len(p.ids) == length
                assert p.ids == chat_prompt(tok, vocab, p.user_text(tok)), (length, depth, n)
    with pytest.raises(ValueError, match="shorter than the prompt without any haystack"):
        prompt_for(tok, hay, 40, 50)


def test_haystack_repeats_when_short(tok, tmp_path):
    small = write_haystack(tmp_path / "small.txt", n_sentences=20)
    h = prompts.Haystack.from_file(tok, small, 3000)
    assert len(h) >= 3000
    p = prompt_for(tok, h, 2500, 50)
    assert len(p.ids) == 2500 and p.user_text(tok).count("Line 3 was") >= 2


def test_haystack_inputs(tok, tmp_path):
    rows = tmp_path / "docs.jsonl"
    rows.write_text(
        json.dumps({"text": "One sentence here. Another one there."})
        + "\n\n"
        + json.dumps({"text": "A second document. It ends."})
        + "\n"
    )
    h = prompts.Haystack.from_file(tok, rows, 50)
    assert "A second document" in tok.decode(h.ids.tolist()) and len(h.sentence_start) >= 4
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine."}) + "\n" + json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl line 2: expected a JSON object with a \"text\" field"):
        prompts.Haystack.from_file(tok, bad, 10_000)
    with pytest.raises(FileNotFoundError, match="haystack .*nope.txt does not exist"):
        prompts.Haystack.from_file(tok, tmp_path / "nope.txt", 10)
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="has no text"):
        prompts.Haystack.from_file(tok, tmp_path / "empty.txt", 10)


def test_the_default_haystack_is_made_where_the_sample_is_not(tmp_path, monkeypatch):
    """On a clean clone data/sample is not there yet: make_retrieval with its default haystack makes it, as
    lwm.eval.needle does (it exited 2, "--haystack .../text.jsonl does not exist", when the suite ran it
    before anything had made the sample); any other missing haystack is still named."""
    from lwm.synth import make_retrieval

    default = tmp_path / "sample" / "text.jsonl"
    made = []

    def ensure_sample():
        default.parent.mkdir()
        default.write_text(json.dumps({"text": " ".join(["Some words of text here."] * 40)}) + "\n")
        made.append(default)

    monkeypatch.setattr(prompts, "DEFAULT_HAYSTACK", default)
    monkeypatch.setattr(make_sample, "ensure_sample", ensure_sample)
    config = dict(n=3, heldout=2, needles=1, ask=1)
    assert make_retrieval.run(make_retrieval.RetrievalConfig(out=tmp_path / "r", haystack=default, **config)) == 0
    assert made == [default] and len((tmp_path / "r" / "train.jsonl").read_text().splitlines()) == 3
    assert prompts.haystack_path(None) == default and made == [default]  # made once
    with pytest.raises(ValueError, match="--haystack .*other.jsonl does not exist"):
        make_retrieval.run(
            make_retrieval.RetrievalConfig(out=tmp_path / "s", haystack=tmp_path / "other.jsonl", **config)
        )


# --- scoring ---------------------------------------------------------------------------------------


def test_scoring():
    assert ng.found_in(4821937, "The special magic Paris number is: 4821937.")
    assert ng.found_in(4821937, "4,821,937")
    assert ng.found_in(4821937, "4821937")
    assert not ng.found_in(4821937, "48219370")  # part of a longer number
    assert not ng.found_in(4821937, "14821937")
    assert not ng.found_in(4821937, "482193")
    assert not ng.found_in(4821937, "I don't know.")


# --- run_needle with stub generators ---------------------------------------------------------------


class Oracle:
    """Answers with the numbers of every needle in the prompt (reads them back from the text)."""

    def __init__(self, tok, only_first=False):
        self.tok, self.only_first, self.prompts = tok, only_first, []

    def generate(self, ids, config):
        self.prompts.append(list(ids))
        text = self.tok.decode(ids)
        numbers = __import__("re").findall(r"special magic [A-Za-z ]+ number is: (\d+)\.", text)
        if self.only_first:  # the number of the city named first in the question
            first = __import__("re").search(r"numbers for ([A-Za-z ]+?)(,| and)", text).group(1)
            numbers = __import__("re").findall(rf"special magic {first} number is: (\d+)\.", text)
        return self.tok.encode("The numbers are " + ", ".join(numbers) + ".")


class Wrong:
    def __init__(self, tok):
        self.tok = tok

    def generate(self, ids, config):
        return self.tok.encode("I do not know the number 1234.")


def test_stub_that_answers_gets_1_and_one_that_does_not_gets_0(tok, hay):
    vocab = Vocab(tok.vocab_size)
    lengths, depths = [200, 600], [0, 50, 100]
    oracle = Oracle(tok)
    good = ng.run_needle(oracle, tok, vocab, lengths, depths, trials=2, haystack=hay)
    assert good["accuracy"] == 1.0 and good["trials_failed"] == 0
    assert [c["accuracy"] for c in good["cells"]] == [1.0] * 6
    assert [len(p) for p in oracle.prompts] == [n for n in lengths for _ in depths for _ in range(2)]
    assert len(good["trials"]) == 12 and all(r["correct"] and r["prompt_tokens"] == r["length"] for r in good["trials"])
    cities = {(r["length"], r["depth"], r["trial"]): (r["city"], r["number"]) for r in good["trials"]}
    assert len(set(cities.values())) > 6  # a new city and number per trial
    bad = ng.run_needle(Wrong(tok), tok, vocab, lengths, depths, trials=2, haystack=hay)
    assert bad["accuracy"] == 0.0 and [c["accuracy"] for c in bad["cells"]] == [0.0] * 6
    assert bad["trials"][0]["answer"] == "I do not know the number 1234."
    again = ng.run_needle(Oracle(tok), tok, vocab, lengths, depths, trials=2, haystack=hay)
    assert cities == {
        (r["length"], r["depth"], r["trial"]): (r["city"], r["number"]) for r in again["trials"]
    }  # seeded


def test_multi_needle_bookkeeping(tok, hay):
    vocab = Vocab(tok.vocab_size)
    res = ng.run_needle(
        Oracle(tok, only_first=True), tok, vocab, [900], [0, 40], trials=3, needles=4, ask=2, haystack=hay
    )
    assert res["config"]["needles"] == 4 and res["config"]["ask"] == 2
    for r in res["trials"]:
        items = r["needles"]
        assert len(items) == 4 and sum(i["asked"] for i in items) == 2
        assert [i["depth"] for i in items] == pytest.approx(prompts.needle_depths(r["depth"], 4), abs=1e-3)
        assert [i["position"] for i in items] == sorted(i["position"] for i in items)  # in depth order
        assert len({i["city"] for i in items}) == 4 and len({i["number"] for i in items}) == 4
        asked = [i["city"] for i in items if i["asked"]]
        assert all(c in r["question"] for c in asked) and r["question"].startswith("What are the special magic numbers")
        assert not any(i["city"] in r["question"] for i in items if not i["asked"])
        assert [i["found"] for i in items if not i["asked"]] == [None, None]
        assert sorted(i["found"] for i in items if i["asked"]) == [False, True]  # only the first city answered
        assert r["score"] == 0.5 and r["correct"] is False and "city" not in r
    assert [c["accuracy"] for c in res["cells"]] == [0.5, 0.5] and [c["all_found"] for c in res["cells"]] == [0.0, 0.0]
    full = ng.run_needle(Oracle(tok), tok, vocab, [900], [0], trials=2, needles=4, ask=4, haystack=hay)
    assert full["accuracy"] == 1.0 and all(r["correct"] for r in full["trials"])


def test_a_failing_trial_is_recorded_and_the_run_goes_on(tok, hay):
    class Flaky(Oracle):
        def generate(self, ids, config):
            if len(ids) == 600:
                raise RuntimeError("out of memory (pretend)")
            return super().generate(ids, config)

    seen = []
    res = ng.run_needle(
        Flaky(tok),
        tok,
        Vocab(tok.vocab_size),
        [200, 600],
        [0, 100],
        trials=1,
        haystack=hay,
        on_trial=lambda r, rs: seen.append(len(rs)),
    )
    assert seen == [1, 2, 3, 4] and res["trials_failed"] == 2 and res["accuracy"] == 1.0
    failed = [r for r in res["trials"] if r["error"]]
    assert [r["length"] for r in failed] == [600, 600] and "out of memory (pretend)" in failed[0]["error"]
    cells = {(c["length"], c["depth"]): c for c in res["cells"]}
    assert cells[(600, 0.0)]["accuracy"] is None and cells[(600, 0.0)]["failed"] == 1
    assert cells[(200, 100.0)]["accuracy"] == 1.0


def test_bad_grids(tok, hay):
    vocab = Vocab(tok.vocab_size)
    for kwargs, message in [
        (dict(depths=[0, 120]), r"depths must lie in 0..100.*\[120"),
        (dict(depths=[-5]), r"depths must lie in 0..100"),
        (dict(lengths=[64]), r"lengths \[64\] are shorter than the needle\(s\) and question"),
        (dict(needles=2, ask=3), r"ask must lie in 1..needles \(2\), got 3"),
        (dict(trials=0), r"trials must be >= 1"),
    ]:
        args = {"lengths": [300], "depths": [50], "trials": 1, **kwargs}
        with pytest.raises(ValueError, match=message):
            ng.run_needle(
                Wrong(tok),
                tok,
                vocab,
                args.pop("lengths"),
                args.pop("depths"),
                args.pop("trials"),
                haystack=hay,
                **args,
            )


# --- plots -----------------------------------------------------------------------------------------


def test_heatmap_and_tables(tmp_path):
    png = heatmap(
        [[1.0, None], [0.25, float("nan")], [0.0, 0.5]],
        ["0", "50", "100"],
        ["1K", "2K"],
        tmp_path / "h.png",
        title="t",
        xlabel="x",
        ylabel="y",
    )
    with Image.open(png) as img:
        img.verify()
    with Image.open(png) as img:
        assert img.format == "PNG" and img.width > 100 and img.height > 100
        rgb = img.convert("RGB")  # matplotlib writes RGBA
        assert color_at(1.0) in {rgb.getpixel((x, y)) for x in range(rgb.width) for y in range(rgb.height)}
    assert (
        color_at(0.0) == (0xF0, 0x49, 0x6E) and color_at(1.0) == (0x0C, 0xD7, 0x9F) and color_at(2.0) == color_at(1.0)
    )
    assert color_at(None) == color_at(float("nan"))
    assert [human_count(n) for n in (128, 1024, 1536, 32768, 1 << 20)] == ["128", "1K", "1.5K", "32K", "1M"]
    table = grid_table([[1.0, None]], ["0"], ["1K", "2K"], corner="d")
    head, rule, row = ([c.strip() for c in line.strip("|").split("|")] for line in table.splitlines())
    assert head == ["d", "1K", "2K"] and set("".join(rule)) == {"-"} and row == ["0", "1.00", "n/a"]
    with pytest.raises(ValueError, match="3 x 2 grid"):
        heatmap([[1.0]], ["a", "b", "c"], ["x", "y"], tmp_path / "bad.png")


# --- the command -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    from lwm.interop.hf import to_hf
    from lwm.model import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("debug", vocab_size=Vocab(4096).size))
    return to_hf(model, tmp_path_factory.mktemp("needle_model") / "hf", tokenizer_model=TOKENIZER)


CLI_ARGS = [
    "--lengths",
    "128",
    "256",
    "--depths",
    "0",
    "100",
    "--trials",
    "1",
    "--max-new-tokens",
    "6",
    "--device",
    "cpu",
]


@pytest.fixture(scope="module")
def one_process(hf_model, tmp_path_factory) -> Path:
    """The command in this process (main(argv), as the script runs it)."""
    out = tmp_path_factory.mktemp("needle_out") / "one"
    printed = io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(printed):
        assert nd.main(["--model", str(hf_model), "--out", str(out), *CLI_ARGS]) == 0
    assert "accuracy" in printed.getvalue() and "| depth \\ length |" in squeeze(printed.getvalue())
    return out


def test_command_writes_json_and_heatmap(one_process, hf_model):
    res = json.loads((one_process / "needle.json").read_text())
    cfg = res["config"]
    assert cfg["complete"] and cfg["lengths"] == [128, 256] and cfg["depths"] == [0.0, 100.0] and cfg["trials"] == 1
    assert cfg["model"] == str(hf_model) and cfg["world_size"] == 1
    assert len(res["trials"]) == 4
    for r in res["trials"]:
        assert {"length", "depth", "city", "number", "answer", "correct", "score", "needles"} <= set(r)
        assert r["error"] is None and r["prompt_tokens"] == r["length"] and isinstance(r["answer"], str)
        assert r["correct"] == ng.found_in(r["number"], r["answer"])
    assert [(c["length"], c["depth"]) for c in res["cells"]] == [(128, 0.0), (128, 100.0), (256, 0.0), (256, 100.0)]
    assert all(0.0 <= c["accuracy"] <= 1.0 for c in res["cells"])
    with Image.open(one_process / "needle_heatmap.png") as img:
        img.verify()
    with Image.open(one_process / "needle_heatmap.png") as img:
        assert img.format == "PNG" and img.width > 150 and img.height > 100


def test_command_under_torchrun_matches_one_process(one_process, hf_model, tmp_path):
    """cp=2 with the ranks torchrun --nproc_per_node=2 starts (forked, under the NCCL contract): the same trials
    and answers; only rank 0 writes and prints."""
    proc = forked_command("lwm.eval.needle", ["--model", str(hf_model), "--out", str(tmp_path / "cp2"), *CLI_ARGS], 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("accuracy") == 1  # rank 0 only
    one = json.loads((one_process / "needle.json").read_text())
    two = json.loads((tmp_path / "cp2" / "needle.json").read_text())
    assert two["config"]["world_size"] == 2
    key = lambda r: (r["length"], r["depth"], r["city"], r["number"], r["answer"], r["correct"])  # noqa: E731
    assert [key(r) for r in two["trials"]] == [key(r) for r in one["trials"]]


def test_command_bad_input(hf_model, tmp_path, capsys):
    """Exit status 2 and a message naming the input (main() is what the script exits with)."""
    cases = [
        (["--model", str(tmp_path / "missing")], "model " + str(tmp_path / "missing") + " does not exist"),
        (["--haystack", str(tmp_path / "nope.jsonl")], "haystack " + str(tmp_path / "nope.jsonl") + " does not exist"),
        (["--depths", "0", "150"], "depths must lie in 0..100 (percent of the context), got [150.0]"),
        (["--lengths", "32", "256"], "lengths [32] are shorter than the needle(s) and question"),
        (["--needles", "2", "--ask", "3"], "ask must lie in 1..needles (2), got 3"),
        (["--out", str(hf_model / "config.json")], "config.json cannot be the results folder: "),
    ]
    for extra, message in cases:
        code = nd.main(["--model", str(hf_model), "--out", str(tmp_path / "o"), "--device", "cpu", *extra])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("needle: ") and message in err, (extra, err)
    assert not (tmp_path / "o").exists()  # nothing written for bad input
    assert (ROOT / "lwm" / "eval" / "needle.py").read_text().rstrip().endswith("sys.exit(main())")


def test_min_length_is_enough(tok, hay):
    """Every trial fits at the shortest length the checks allow, with any cities."""
    for n, ask in ((1, 1), (3, 3), (5, 2)):
        shortest = prompts.min_length(tok, n, ask)
        for seed in range(30):
            items = prompts.make_needles(random.Random(seed), 50, n, ask)
            p = prompts.build_prompt(tok, hay, shortest, items, prompts.question_for(items))
            assert len(p.ids) == shortest
    assert np.all(np.diff(hay.sentence_start) > 0)


def test_digits_and_haystack_start(tok, hay):
    """--digits: every needle's number has that many digits (one digit: 0-9), and an oracle still
    scores 1; text_from moves the haystack window, not the prompt's length or its needle."""
    for digits in (1, 2, 7):
        res = ng.run_needle(
            Oracle(tok), tok, Vocab(tok.vocab_size), [200], [0, 50, 100], trials=4, haystack=hay, digits=digits
        )
        assert res["accuracy"] == 1.0 and res["config"]["digits"] == digits
        assert all(len(str(r["number"])) == digits for r in res["trials"])
    with pytest.raises(ValueError, match="digits must be >= 1, got 0"):
        prompts.number_range(0)
    with pytest.raises(ValueError, match="12 needles need distinct numbers; 1 digit"):
        ng.run_needle(Oracle(tok), tok, Vocab(tok.vocab_size), [400], [0], needles=12, haystack=hay, digits=1)
    items = prompts.make_needles(random.Random(0), 50, 1, 1)
    first = prompts.build_prompt(tok, hay, 300, items, prompts.question_for(items))
    later = prompts.build_prompt(tok, hay, 300, items, prompts.question_for(items), text_from=2000)
    assert len(first.ids) == len(later.ids) == 300 and first.ids != later.ids
    start = later.context.start
    assert later.ids[start : start + 20] != first.ids[start : start + 20]
    assert tok.decode(later.ids).count(items[0].text) == 1


def test_chat_training_examples_are_the_evaluation_prompts(tmp_path, tok, sample_text):
    """lwm/synth/make_retrieval.py --form chat: each prompt is lwm/eval/needle.py's (LWM's chat form, its
    template and question, the stated length with BOS), its answer the asked number; seeded, and
    the held-out file disjoint from the training one."""
    from lwm.synth import make_retrieval

    args = ["--form", "chat", "--lengths", "120", "300", "--needles", "1", "--ask", "1", "--n", "30", "--heldout", "10"]
    make_retrieval.main(["--out", str(tmp_path / "a"), *args])
    make_retrieval.main(["--out", str(tmp_path / "b"), *args])
    rows = [json.loads(line) for line in open(tmp_path / "a" / "train.jsonl")]
    assert (tmp_path / "a" / "train.jsonl").read_text() == (tmp_path / "b" / "train.jsonl").read_text()
    held = [json.loads(line) for line in open(tmp_path / "a" / "heldout.jsonl")]
    assert len(rows) == 30 and len(held) == 10 and not {r["prompt"] for r in rows} & {r["prompt"] for r in held}
    for r in rows:
        ids = [tok.bos_id, *tok.encode(r["prompt"])]  # what the data pipeline trains on
        assert len(ids) == r["length"] and 120 <= r["length"] <= 300
        city = r["prompt"].split("What is the special magic ")[1].split(" number?")[0]
        before, after = prompts.template(tok, prompts.QUESTION.format(city=city))  # the evaluation's template
        assert ids[: len(before)] == before and ids[-len(after) :] == after
        number = r["answer"].removesuffix(".")
        assert len(number) == 1 and r["fields"] == "[prompt],answer"
        assert tok.decode(ids).count(prompts.NEEDLE.format(city=city, number=number)) == 1
    assert len({r["prompt"][60:160] for r in rows}) > 20  # the haystack text starts at varied places
    make_retrieval.main(["--out", str(tmp_path / "cue"), *args, "--no-instruction"])
    for r in map(json.loads, open(tmp_path / "cue" / "train.jsonl")):
        city = r["prompt"].split("What is the special magic ")[1].split(" number?")[0]
        assert r["prompt"].endswith(f"What is the special magic {city} number? ASSISTANT:")
        assert len(tok.encode(r["prompt"])) + 1 == r["length"] and prompts.INSTRUCTION not in r["prompt"]
    make_retrieval.main(["--out", str(tmp_path / "bare"), *args, "--numberless"])
    hay = (tmp_path / "bare" / "haystack.txt").read_text()
    assert len(hay) > 10_000 and not any(c.isdigit() for c in hay)
    for r in map(json.loads, open(tmp_path / "bare" / "train.jsonl")):
        digits = [c for c in r["prompt"] if c.isdigit()]
        assert digits == [r["answer"][0]]  # the needle's number is the only one left


def test_run_takes_every_field_of_its_config(hf_model, tok, tmp_path, capsys, sample_text):
    """run(NeedleConfig) in this process, as another command calls it: each field of the grid and
    of the model's options lands in needle.json and in the trials."""
    grid = nd.NeedleGrid(
        lengths=[160],
        depths=[30],
        trials=2,
        needles=2,
        ask=1,
        haystack=str(TEXT),
        max_new_tokens=3,
        seed=5,
        digits=3,
        instruction=False,
    )
    model = ModelOptions(model=str(hf_model), tokenizer=str(TOKENIZER), device="cpu", dtype="float32", layout="zigzag")
    assert nd.run(nd.NeedleConfig(model=model, grid=grid, out=str(tmp_path / "o"))) == 0
    res = json.loads((tmp_path / "o" / "needle.json").read_text())
    same = ng.run_needle(Oracle(tok), tok, Vocab(tok.vocab_size), [160], [30], 2, needles=2, ask=1, haystack=TEXT,
                         seed=5, digits=3, instruction="", max_new_tokens=3)  # fmt: skip
    c = res["config"]
    assert {k: c[k] for k in same["config"]} == same["config"]  # lengths ... instruction, haystack, seed, digits
    assert (c["model"], c["tokenizer"], c["device"], c["dtype"], c["layout"]) == (
        str(hf_model), str(TOKENIZER), "cpu", "float32", "zigzag"
    )  # fmt: skip
    placed = lambda r: [(n["city"], n["number"], n["position"], n["asked"]) for n in r["needles"]]  # noqa: E731
    assert [placed(r) for r in same["trials"]] == [placed(r) for r in res["trials"]]  # the seed's needles
    assert all(len(r["needles"]) == 2 and len(str(r["needles"][0]["number"])) == 3 for r in res["trials"])
    assert "| depth \\ length |" in squeeze(capsys.readouterr().out)
