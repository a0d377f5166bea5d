"""Cached codes and data files from elsewhere are not trusted: a video id never leads out of the code
store's tokens/ folder, and a codes file must be a whole .npy of integer codes, 256 a frame. Each
refusal names the file (and, in a data source, the line)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from lwm.data import CodeStore, ExampleError, PackedStream, Source, TextTokenizer, Vocab, encode_example


@pytest.fixture
def store(tmp_path):
    """A code store with one good video, and a secret .npy beside it that no id may reach."""
    root = tmp_path / "codes"
    (root / "tokens").mkdir(parents=True)
    np.save(root / "tokens" / "good.npy", np.arange(2 * 256, dtype=np.uint16).reshape(2, 256))
    np.save(tmp_path / "secret.npy", np.ones((1, 256), np.uint16))
    (root / "manifest.jsonl").write_text(json.dumps({"id": "good", "timestamps": [0.0, 1.0]}) + "\n")
    return root


@pytest.fixture(scope="module")
def tok(spm_model):
    return TextTokenizer(spm_model)


def escapes(tmp_path, root):
    """Ids that name the secret: absolute, through '..', through a symlink out of tokens/."""
    os.symlink(tmp_path / "secret.npy", root / "tokens" / "link.npy")
    return [str(tmp_path / "secret"), "../../secret", "link"]


def test_ids_never_leave_the_tokens_folder(tmp_path, store):
    codes = CodeStore(store)
    for vid in escapes(tmp_path, store):
        with pytest.raises(ValueError, match=f"video id '{vid}' names {tmp_path / 'secret.npy'}, outside {store}"):
            codes.load(vid)
    os.symlink(store / "tokens" / "good.npy", store / "tokens" / "alias.npy")  # a link inside stays allowed
    assert (codes.load("alias") == codes.load("good")).all()


def test_a_vision_field_that_leaves_the_folder_names_the_data_file_and_line(tmp_path, store, tok):
    vids = escapes(tmp_path, store)
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"vision": v, "caption": "a red circle"}) + "\n" for v in ["good", *vids]))
    stream = PackedStream(
        [Source(str(src), fields="[vision],caption")], Vocab(tok.vocab_size), tok, 4096, 1, codes=CodeStore(store)
    )
    list(stream.sequences(0))
    assert stream.stats["skipped"] == 3  # the good example is trained on; the run goes on
    for n, vid in enumerate(vids, 2):
        assert any(e.startswith(f"{src}:{n}: video id '{vid}' names") and "outside" in e for e in stream.errors)


@pytest.mark.parametrize(
    "write, message",
    [
        (lambda p: np.save(p, np.zeros((4, 100), np.uint16)), r"shape \(4, 100\); expected \(frames > 0, 256\)"),
        (lambda p: np.save(p, np.zeros((4, 256), np.float32)), "are float32; expected an integer dtype"),
        (lambda p: np.save(p, np.zeros((4, 2, 128), np.int64)), r"shape \(4, 2, 128\)"),
        (lambda p: p.write_bytes(p.with_name("good.npy").read_bytes()[:-100]), "cut short or corrupted"),
        (lambda p: p.write_bytes(b""), "cut short or corrupted"),
        (lambda p: p.write_bytes(b"PK\x03\x04 not a zip either"), "cut short or corrupted"),
        (lambda p: np.save(p, np.array([[1, "x"]], dtype=object), allow_pickle=True), "cut short or corrupted"),
    ],
    ids=["width", "float", "3d", "cut", "empty", "zip", "pickle"],
)
def test_bad_codes_files_are_refused_naming_them(store, write, message):
    path = store / "tokens" / "bad.npy"
    write(path)
    with pytest.raises(ValueError, match=message) as e:
        CodeStore(store).load("bad")
    assert str(path) in str(e.value)


def test_codes_outside_the_vocabulary_name_their_file(store, tok):
    np.save(store / "tokens" / "bad.npy", np.full((1, 256), 9000, np.int64))
    with pytest.raises(ExampleError, match=f"cached codes {store / 'tokens' / 'bad.npy'}: codes must lie in"):
        encode_example({"vision": "bad"}, Vocab(tok.vocab_size), tok, CodeStore(store), "vision")
