"""Data at scale: a source's index (made once, remade when stale), the epoch's packing plan from token
counts (the same sequences as packing the encoded examples), a rank that encodes only its own examples,
resume as a seek with loader workers, and parquet sources read by row groups.

Longer than most test files: one subject's tests kept together, beside the helpers they share.
"""

import json
import multiprocessing.pool
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from code_samples import T_FRAMES

from lwm.data import CodeStore, DataConfig, PackedStream, Packer, Sharding, Source
from lwm.data.example import Encoder, ExampleError
from lwm.data.index import IndexNotWritable, example_key, source_index
from lwm.data.stream import StaleIndex
from lwm.train.datamodule import LWMDataModule

WORDS = "the red green blue circle square moves left right up down frame".split()


def examples(n: int, seed: int) -> list[dict]:
    """Question-answer examples over cached videos, short and long texts, and some that do not encode."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            out.append(
                {
                    "vision": list(T_FRAMES)[i % 3],
                    "question": " ".join(rng.choice(WORDS, 5)),
                    "answer": " ".join(rng.choice(WORDS, 3)),
                    "fields": "[vision+question],answer",
                }
            )
        elif kind == 4 and i % 3 == 0:
            out.append({"question": "no answer here", "fields": "[question],answer"})  # skipped
        else:
            out.append({"text": " ".join(rng.choice(WORDS, int(rng.integers(3, 400))))})
    return out


def write_jsonl(path, rows, bad_lines=()):
    lines = [json.dumps(r) for r in rows]
    for at in bad_lines:
        lines.insert(at, "{not json")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return [
        Source(str(write_jsonl(root / "mixed.jsonl", examples(60, 1), bad_lines=(7,))), fields="text"),
        Source(str(write_jsonl(root / "books.jsonl", examples(12, 2))), fields="text", overflow="window", repeat=2),
        Source(str(write_jsonl(root / "short.jsonl", examples(20, 3))), fields="text", overflow="drop"),
    ]


def stream_of(sources, tok, vocab, codes_dir, seq_len=256, **kw):
    return PackedStream(sources, vocab, tok, seq_len, kw.pop("batch_size", 2), codes=CodeStore(codes_dir), seed=5, **kw)


def reference_sequences(stream, epoch):
    """The epoch packed the way it was before plans: every example of the order encoded and fed to one
    Packer per overflow policy (lwm.data.packing), bad ones left out."""
    packers, out = {}, []
    for s, i in zip(*(a.tolist() for a in stream._order(epoch))):
        source = stream.sources[s]
        try:
            enc = stream.encoder(stream.indexes[s].reader.example(i), source.fields, example_key(source.path, i))
        except (ExampleError, ValueError):
            continue
        packer = packers.setdefault(
            source.overflow, Packer(stream.seq_len, source.overflow, pad_id=stream.vocab.pad_id)
        )
        out += list(packer.add(enc))
    for packer in packers.values():
        out += list(packer.flush())
    return out


def same(a, b) -> bool:
    return all(
        np.array_equal(getattr(a, k), getattr(b, k)) for k in ("tokens", "loss_weight", "vision_mask", "segment_ids")
    )


def test_a_plan_packs_what_the_packer_packs(corpus, tok, vocab, codes_dir):
    """Three policies (truncate, window, drop), repeats, a line that is not JSON and examples that do not
    encode: the plan's sequences are the Packer's on the encoded examples, sequence for sequence."""
    stream = stream_of(corpus, tok, vocab, codes_dir)
    for epoch in (0, 1):
        planned, reference = list(stream.sequences(epoch)), reference_sequences(stream, epoch)
        assert len(planned) == len(reference) > 20
        assert all(same(a, b) for a, b in zip(planned, reference)), epoch
    p = stream.plan(0)
    assert p.stats["windowed"] > 0 and p.stats["dropped_too_long"] > 0 and p.total_skipped == stream.skipped > 0


def test_a_rank_encodes_only_the_examples_of_its_own_sequences(corpus, tok, vocab, codes_dir):
    """dp 4: each rank encodes the examples of its sequences and no others, each once per run of its pieces
    (a windowed example's later window may come a few sequences on), as dp 1 does over all of them."""
    from itertools import islice

    from lwm.data import StreamState

    full = stream_of(corpus, tok, vocab, codes_dir, batch_size=8)
    list(islice(full.batches(StreamState()), 3))
    total = full.encoded["examples"]
    counts = []
    for r in range(4):
        rank = stream_of(corpus, tok, vocab, codes_dir, batch_size=2, dp_rank=r, dp_size=4)
        keys = []
        rank.encoder = _Recording(rank.encoder, keys)
        got = list(islice(rank.batches(StreamState()), 3))
        p = rank.plan(0)
        own = [piece[:2] for g in range(3) for b in range(2) for piece in p.sequence(g * 8 + r * 2 + b)]
        assert {k for k in keys} == set(own)  # nothing that is not in its sequences
        assert len(keys) == len([x for n, x in enumerate(own) if n == 0 or own[n - 1] != x])  # each once
        assert len(got) == 3
        counts.append(rank.encoded["examples"])
    everything = [piece[:2] for n in range(24) for piece in full.plan(0).sequence(n)]
    assert total == runs(everything) and max(counts) < 0.6 * total, (counts, total)


def runs(keys: list) -> int:
    """Runs of equal consecutive keys: the examples a stream encodes (it keeps the last one)."""
    return sum(n == 0 or keys[n - 1] != k for n, k in enumerate(keys))


class _Recording:
    def __init__(self, encoder, keys):
        self.encoder, self.keys = encoder, keys

    def __call__(self, example, fields, key):
        stem, i = key.rsplit(":", 1)
        names = {"mixed": 0, "books": 1, "short": 2}
        self.keys.append((names[stem], int(i)))
        return self.encoder(example, fields, key)


def make_dm(corpus, spm_model, codes_dir, seq_len=1024, batch_size=2, workers=2, **sharding):
    cfg = DataConfig(
        sources=corpus,
        tokenizer=str(spm_model),
        codes=str(codes_dir),
        batch_size=batch_size,
        seed=3,
        num_workers=workers,
    )
    dm = LWMDataModule(cfg, seq_len=seq_len, sharding=Sharding(**sharding))
    dm.setup()
    return dm


def take(dm, n):
    it = iter(dm.train_dataloader())
    return [dm.on_before_batch_transfer(next(it)) for _ in range(n)]


def test_resume_with_workers_at_dp_1_and_2_and_onto_another_dp(corpus, spm_model, codes_dir):
    """Loader workers on (2 per rank): an uninterrupted run's batches equal a run resumed mid-epoch and in the
    next epoch, at dp 1, at dp 2, and resumed onto dp 2 from dp 1 (the same global batch of 2); the state
    is the batch the loop took, not what a worker made ahead."""
    corpus = corpus[:1]
    straight = take(make_dm(corpus, spm_model, codes_dir), 32)
    epochs = [int(b["data_state"][0]) if "data_state" in b else None for b in straight]
    assert epochs == [None] * 32  # the loop took the state out of each batch
    dm = make_dm(corpus, spm_model, codes_dir, workers=0)
    per_epoch = len(dm.stream.plan(0)) // 2
    assert 5 < per_epoch < 26, per_epoch  # 32 batches cross an epoch
    for stop in (4, per_epoch + 2):
        dm = make_dm(corpus, spm_model, codes_dir)
        take(dm, stop)
        state = dm.state_dict()
        assert (state["epoch"], state["batches"]) == divmod(stop, per_epoch)
        resumed = make_dm(corpus, spm_model, codes_dir)
        resumed.load_state_dict(state)
        for a, b in zip(straight[stop:], take(resumed, 6)):
            assert all(torch.equal(a[k], b[k]) for k in a), stop
        halves = []
        for r in range(2):  # onto dp 2: rank r keeps row r of the global batch
            rank = make_dm(corpus, spm_model, codes_dir, batch_size=1, dp_rank=r, dp_size=2)
            rank.load_state_dict(state)
            halves.append(take(rank, 6))
        for a, b0, b1 in zip(straight[stop:], *halves):
            assert all(torch.equal(a[k], torch.cat([b0[k], b1[k]])) for k in ("tokens", "targets", "loss_weight"))
    # dp 2 resumed at dp 2
    ranks = [take(make_dm(corpus, spm_model, codes_dir, batch_size=1, dp_rank=r, dp_size=2), 8) for r in range(2)]
    for r in range(2):
        dm = make_dm(corpus, spm_model, codes_dir, batch_size=1, dp_rank=r, dp_size=2)
        take(dm, 5)
        again = make_dm(corpus, spm_model, codes_dir, batch_size=1, dp_rank=r, dp_size=2)
        again.load_state_dict(dm.state_dict())
        assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(ranks[r][5:], take(again, 3)))


def test_an_index_is_made_once_and_remade_when_its_source_changes(tmp_path, tok, vocab, codes_dir, monkeypatch):
    """The second start reads the index (no example encoded at start-up); an edited source, another tokenizer
    or new codes make it again; a damaged index file is made again, never trusted."""
    src = write_jsonl(tmp_path / "docs.jsonl", examples(30, 4))
    encoder = Encoder(vocab, tok, CodeStore(codes_dir))
    first = source_index(src, encoder, "text")
    assert first.made and first.file.parent == tmp_path and first.file.is_file()
    calls = []
    monkeypatch.setattr(Encoder, "__call__", lambda self, *a: calls.append(a) or pytest.fail("encoded"))
    second = source_index(src, encoder, "text")
    assert not second.made and not calls and np.array_equal(second.lengths, first.lengths)
    assert second.reasons == first.reasons and len(second.reasons) == 2
    monkeypatch.undo()
    time.sleep(0.01)
    write_jsonl(src, [*examples(30, 4), {"text": "one more line"}])
    third = source_index(src, encoder, "text")
    assert third.made and len(third) == 31 and third.file == first.file
    first.file.write_bytes(b"not an index")
    assert source_index(src, encoder, "text").made
    assert not source_index(src, encoder, "text").made
    other = source_index(src, encoder, ["text"])  # another default spec: another index, kept beside
    assert other.made and other.file != first.file
    (codes_dir / "tokens" / "clip_d.npy").write_bytes((codes_dir / "tokens" / "clip_a.npy").read_bytes())
    try:
        assert source_index(src, Encoder(vocab, tok, CodeStore(codes_dir)), "text").made  # tokens/ changed
    finally:
        (codes_dir / "tokens" / "clip_d.npy").unlink()
    here = tmp_path / "indexes"
    assert source_index(src, encoder, "text", index_dir=here).file.parent == here

    def read_only(self, *a, **k):
        raise PermissionError("read-only file system")

    source_index(src, encoder, "text")  # current again (tokens/ changed twice)
    monkeypatch.setattr("lwm.data.index.FileLock.acquire", read_only)
    assert not source_index(src, encoder, "text").made  # no lock to take: the current index is still read
    with pytest.raises(IndexNotWritable, match="read-only file system"):
        source_index(src, encoder, "question")  # none to read
    monkeypatch.undo()
    (tmp_path / "file").write_text("")
    with pytest.raises(
        IndexNotWritable, match=r"cannot keep the index of data source .*docs\.jsonl in .*data\.index_dir"
    ):
        source_index(src, encoder, "text", index_dir=tmp_path / "file" / "sub")


def test_an_epochs_plan_is_kept_and_later_starts_map_it(tmp_path, tok, vocab, codes_dir, monkeypatch, caplog):
    """The first start plans epoch 0 and keeps it beside the index; a later start (a rank, a resume, a loader
    worker) maps the file and plans nothing, with the same sequences; planning epoch e removes the kept
    plans before e - 1; another seq_len or an edited source plans anew; a damaged plan file is planned
    again, never trusted; a folder that cannot be written plans in memory."""
    import pickle

    import lwm.data.stream as dataset
    from lwm.data.epoch_plan import ARRAYS

    src = write_jsonl(tmp_path / "docs.jsonl", examples(40, 7))
    sources = [Source(str(src), fields="text", overflow="window")]
    first = stream_of(sources, tok, vocab, codes_dir)
    kept = lambda: sorted(f.name.split(".")[-3] for f in tmp_path.glob("docs.jsonl.*.lwm-plan.npy"))  # noqa: E731
    assert kept() == ["e0"]
    monkeypatch.setattr(dataset, "plan_epoch", lambda *a: pytest.fail("planned again"))
    second = stream_of(sources, tok, vocab, codes_dir)
    mapped, made = second.plan(0), first.plan(0)
    assert mapped.file is not None and isinstance(mapped.piece_pos, np.memmap) and made.file is None
    assert all(np.array_equal(getattr(mapped, k), getattr(made, k)) for k in ARRAYS)
    assert (mapped.stats, mapped.total_skipped) == (made.stats, made.total_skipped) and mapped.stats["windowed"]
    reference = reference_sequences(first, 0)
    assert len(reference) > 5 and all(same(a, b) for a, b in zip(second.sequences(0), reference, strict=True))
    worker = pickle.loads(pickle.dumps(second))  # what a loader worker receives: no copy of the plan
    assert worker._plans == {} and worker.plan(0).file == mapped.file
    monkeypatch.undo()
    for epoch in (1, 2, 3):
        first.plan(epoch)
    assert kept() == ["e2", "e3"]
    shorter = stream_of(sources, tok, vocab, codes_dir, seq_len=128)
    assert shorter.plan(0).file is None and len(list(tmp_path.glob("docs.jsonl.*.e0.lwm-plan.npy"))) == 1
    time.sleep(0.01)
    write_jsonl(src, examples(40, 8))
    edited = stream_of(sources, tok, vocab, codes_dir)
    assert edited.indexes[0].made and edited.plan(0).file is None  # planned, not read
    assert all(same(a, b) for a, b in zip(edited.sequences(0), reference_sequences(edited, 0), strict=True))
    file = stream_of(sources, tok, vocab, codes_dir).plan(0).file
    np.save(file, np.arange(30))  # the header's lengths do not add up
    caplog.set_level("WARNING")
    again = stream_of(sources, tok, vocab, codes_dir)
    assert again.plan(0).file is None and f"the data plan {file} cannot be read" in caplog.text
    assert all(same(a, b) for a, b in zip(again.sequences(0), reference_sequences(edited, 0), strict=True))

    def read_only(self, *a, **k):
        raise PermissionError("read-only file system")

    monkeypatch.setattr("lwm.data.epoch_plan.FileLock.acquire", read_only)
    alone = stream_of(sources, tok, vocab, codes_dir, seq_len=64)  # a new key, nowhere to keep it
    assert alone.plan(1).file is None and len(list(tmp_path.glob("docs.jsonl.*.lwm-plan.npy"))) == 4
    assert all(same(a, b) for a, b in zip(alone.sequences(1), reference_sequences(alone, 1), strict=True))


def test_a_source_changed_during_the_run_stops_it_and_drops_the_index(tmp_path, tok, vocab, codes_dir):
    src = write_jsonl(tmp_path / "docs.jsonl", [{"text": " ".join(WORDS)}] * 12)
    stream = stream_of([Source(str(src), fields="text")], tok, vocab, codes_dir, seq_len=32)
    file = stream.indexes[0].file
    write_jsonl(src, [{"text": "x" * len(" ".join(WORDS))}] * 12)  # lines of the same bytes, other tokens
    with pytest.raises(StaleIndex, match=r"docs\.jsonl:\d+ has \d+ tokens, its index .* says \d+"):
        list(stream.sequences(0))
    assert not file.exists()
    stream = stream_of([Source(str(src), fields="text")], tok, vocab, codes_dir, seq_len=32)
    assert stream.indexes[0].made
    write_jsonl(src, [{"text": "red"}] * 12)  # shorter lines: the offsets no longer start lines
    with pytest.raises(StaleIndex, match=r"docs\.jsonl:\d+ encoded when its index .* was made, and now does not"):
        list(stream.sequences(0))


def test_a_large_source_is_indexed_by_several_processes(tmp_path, tok, vocab, codes_dir, monkeypatch):
    """index_workers 2 on a source over PARALLEL_FROM: the same counts and reasons as one process."""
    import lwm.data.index as index

    src = write_jsonl(tmp_path / "docs.jsonl", examples(90, 5), bad_lines=(3, 50))
    encoder = Encoder(vocab, tok, CodeStore(codes_dir))
    alone = source_index(src, encoder, "text", index_dir=tmp_path / "one")
    monkeypatch.setattr(index, "PARALLEL_FROM", 50)
    monkeypatch.setattr(index, "CHUNK", 20)
    pools = []
    real = index.multiprocessing.get_context

    def spy(method):
        pools.append(method)
        return real(method)

    monkeypatch.setattr(index.multiprocessing, "get_context", spy)
    terminated = []  # the workers end by themselves; a worker's SIGTERM never decides the pool's end
    monkeypatch.setattr(multiprocessing.pool.Pool, "terminate", lambda pool: terminated.append(pool))
    parallel = source_index(src, encoder, "text", index_dir=tmp_path / "two", workers=2)
    assert pools == ["spawn"] and parallel.made and terminated == []
    assert np.array_equal(parallel.lengths, alone.lengths) and parallel.reasons == alone.reasons
    assert len(alone.reasons) == 2 + 6 and alone.reasons[3].startswith(f"{src}:4: not JSON")  # lines, examples


def test_a_failed_parallel_indexing_stops_workers_that_hold_back_sigterm(tmp_path):
    """A worker that fails makes the pool terminate the others with SIGTERM; workers of a main script
    that blocks it (train.py, for SLURM's signals) take it back, else the pool's join waits forever."""
    src = write_jsonl(tmp_path / "docs.jsonl", [{"text": f"example {i}"} for i in range(40)])
    script = tmp_path / "main_script.py"
    script.write_text(
        "import signal, sys\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGUSR1, signal.SIGTERM))  # as train.py\n"
        "import lwm.data.index as index\n"
        "class Broken:\n"
        "    def signature(self):\n"
        "        return {'encoder': 'broken'}\n"
        "    def __call__(self, example, fields, key):\n"
        "        raise RuntimeError('broken encoder')\n"
        "if __name__ == '__main__':\n"
        "    index.PARALLEL_FROM, index.CHUNK = 10, 5\n"
        "    try:\n"
        "        index.source_index(sys.argv[1], Broken(), 'text', index_dir=sys.argv[2], workers=2)\n"
        "    except RuntimeError as e:\n"
        "        print('raised:', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script), str(src), str(tmp_path / "index")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and "raised: broken encoder" in proc.stdout, proc.stderr[-2000:]


def test_parquet_tables_json_arrays_and_json_lines_give_the_same_batches(tmp_path, tok, vocab, codes_dir):
    """The same examples as JSON lines, as parquet in row groups of 7, as CSV and TSV tables written by
    Python's csv module, and as one JSON array (a null answer, an empty cell: a missing field, skipped
    naming its row, line or element; texts with the delimiter, quotes and newlines in them): the same
    sequences, epoch after epoch."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "text": r.get("text"),
            "vision": r.get("vision"),
            "question": r.get("question"),
            "answer": r.get("answer"),
            "fields": r.get("fields"),
        }
        for r in examples(40, 6)
    ]
    rows[3]["text"] = 'a "quoted", text\nover two lines\tand a tab'
    write_jsonl(tmp_path / "ex.jsonl", [{k: v for k, v in r.items() if v is not None} for r in rows])
    (tmp_path / "ex.json").write_text(
        json.dumps([{k: v for k, v in r.items() if v is not None} for r in rows], indent=1)
    )
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "ex.parquet", row_group_size=7)
    for kind, dialect in (("csv", "excel"), ("tsv", "excel-tab")):
        with open(tmp_path / f"ex.{kind}", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, list(rows[0]), dialect=dialect)
            writer.writeheader()
            writer.writerows(rows)
    kinds = ("jsonl", "parquet", "csv", "tsv", "json")
    streams = [
        stream_of([Source(str(tmp_path / f"ex.{kind}"), fields="text", overflow="window")], tok, vocab, codes_dir)
        for kind in kinds
    ]
    assert [s.indexes[0].reader.format for s in streams] == ["jsonl", "parquet", "table", "table", "array"]
    assert all(len(s.indexes[0]) == 40 for s in streams)
    for epoch in (0, 1):
        a, *others = (list(s.sequences(epoch)) for s in streams)
        for b in others:
            assert len(a) == len(b) > 5 and all(same(x, y) for x, y in zip(a, b))
    bad = [i for i, r in enumerate(rows) if r["question"] == "no answer here"]
    assert streams[1].errors[0].startswith(f"{tmp_path / 'ex.parquet'}:row {bad[0]}: unknown field 'answer'")
    assert streams[0].errors[0].startswith(f"{tmp_path / 'ex.jsonl'}:{bad[0] + 1}: unknown field 'answer'")
    line = bad[0] + 2 + int(bad[0] > 3)  # after the header, and the two-line text of row 3
    assert streams[2].errors[0].startswith(f"{tmp_path / 'ex.csv'}:{line}: unknown field 'answer'")
    with pytest.raises(ValueError, match=r"data source .*ex\.txt: expected a JSON-lines .*, parquet .*, table"):
        (tmp_path / "ex.txt").write_text("a,b\n")
        stream_of([Source(str(tmp_path / "ex.txt"))], tok, vocab, codes_dir)
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match=r"data source .*broken\.parquet cannot be read as parquet"):
        stream_of([Source(str(tmp_path / "broken.parquet"))], tok, vocab, codes_dir)


def test_loader_workers_do_not_import_the_main_script_again(tmp_path, spm_model):
    """A worker imports the main script again; what the script imports must be in the fork server already
    (CPython 3.11's server never preloads the script itself), else every worker of every stage imports it
    all again (3 s for train.py). Here the script imports a module that logs each process importing it:
    the script's and the server's, not the 4 workers of two loaders."""
    import subprocess
    import sys

    marker = tmp_path / "imported.txt"
    (tmp_path / "marker_mod.py").write_text('import os\nopen(os.environ["MARKER"], "a").write(f"{os.getpid()}\\n")\n')
    src = write_jsonl(tmp_path / "docs.jsonl", [{"text": " ".join(WORDS)}] * 40)
    (tmp_path / "main_script.py").write_text(
        "import marker_mod  # noqa: F401\n"
        "from lwm.data import DataConfig, Source\n"
        "from lwm.train.datamodule import LWMDataModule\n"
        "if __name__ == '__main__':\n"
        f"    cfg = DataConfig(sources=[Source({str(src)!r}, fields='text')], tokenizer={str(spm_model)!r}, num_workers=2)\n"
        "    dm = LWMDataModule(cfg, seq_len=16)\n"
        "    dm.setup()\n"
        "    for _ in range(2):\n"
        "        it = iter(dm.train_dataloader())\n"
        "        next(it)\n"
        "        del it\n"
    )
    env = {
        **os.environ,
        "MARKER": str(marker),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "main_script.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    pids = set(marker.read_text().split())
    assert len(pids) == 2, (pids, proc.stderr[-2000:])
