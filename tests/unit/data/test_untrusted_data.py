"""Cached codes and data files from elsewhere are not trusted: a video id never leads out of the code
store's tokens/ folder, a codes file must be a whole .npy of integer codes, 256 a frame, and the very
bytes whose sha256 its manifest records. Each refusal names the file (and, in a data source, the line)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from lwm.data import CodeStore, ExampleError, PackedStream, Source, Vocab, encode_example
from lwm.data.code_cache import CodesError, save_codes


@pytest.fixture
def store(tmp_path):
    """A code store with one good video (its checksum in the manifest, as lwm-tokenize writes it), and a
    secret .npy beside it that no id may reach."""
    root = tmp_path / "codes"
    (root / "tokens").mkdir(parents=True)
    with open(root / "tokens" / "good.npy", "wb") as f:
        sha256 = save_codes(f, np.arange(2 * 256, dtype=np.uint16).reshape(2, 256))
    np.save(tmp_path / "secret.npy", np.ones((1, 256), np.uint16))
    (root / "manifest.jsonl").write_text(json.dumps({"id": "good", "timestamps": [0.0, 1.0], "sha256": sha256}) + "\n")
    return root


def flip_a_byte(path) -> None:
    """One bit changed among the codes: the file is still a whole .npy of in-range uint16 codes."""
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x02
    path.write_bytes(bytes(data))


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
    assert stream.skipped == 3  # the good example is trained on; the run goes on
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


def test_a_changed_codes_file_is_refused_naming_it(store, tok):
    """Bytes flipped inside a codes file were trained on with no message: the manifest's sha256 now refuses
    them wherever codes are read (here the store and the training data path, which skips the example)."""
    good = store / "tokens" / "good.npy"
    before = CodeStore(store).load("good")
    flip_a_byte(good)
    with pytest.raises(CodesError, match="are not the file lwm-tokenize wrote") as e:
        CodeStore(store).load("good")
    assert str(good) in str(e.value) and f"{store / 'manifest.jsonl'}:1" in str(e.value)

    src = store.parent / "data.jsonl"
    src.write_text(
        json.dumps({"vision": "good", "caption": "a red circle"})
        + "\n"
        + json.dumps({"caption": "ok", "fields": "caption"})
        + "\n"
    )
    stream = PackedStream(
        [Source(str(src), fields="[vision],caption")], Vocab(tok.vocab_size), tok, 4096, 1, codes=CodeStore(store)
    )
    list(stream.sequences(0))
    assert stream.skipped == 1
    assert stream.errors[0].startswith(f"{src}:1: cached codes {good} are not the file")

    flip_a_byte(good)  # the bytes back as written: accepted again
    assert (CodeStore(store).load("good") == before).all()


def test_a_store_hashes_a_file_once_and_still_sees_it_change(store, monkeypatch):
    """Sampled every epoch, a video's file is hashed once per store while it is unchanged; a change
    (new bytes, a new mtime) is hashed and refused."""
    import os

    from lwm.data import code_cache as codes_module

    hashed = []
    real = codes_module.file_sha256
    monkeypatch.setattr(codes_module, "file_sha256", lambda path: hashed.append(path) or real(path))
    codes = CodeStore(store)
    for _ in range(3):
        codes.load("good")
    assert len(hashed) == 1
    good = store / "tokens" / "good.npy"
    flip_a_byte(good)
    stat = good.stat()
    os.utime(good, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a later write, also within one tick
    with pytest.raises(CodesError, match="are not the file lwm-tokenize wrote"):
        codes.load("good")
    flip_a_byte(good)


def test_a_manifest_without_checksums_is_read_unverified(store):
    """Manifests written before checksums have no sha256: their files are read as before."""
    (store / "manifest.jsonl").write_text(json.dumps({"id": "good", "timestamps": [0.0, 1.0]}) + "\n")
    flip_a_byte(store / "tokens" / "good.npy")
    assert CodeStore(store).load("good").shape == (2, 256)
    (store / "manifest.jsonl").write_text(json.dumps({"id": "good", "sha256": "abc"}) + "\n")
    with pytest.raises(CodesError, match=f"{store / 'manifest.jsonl'}:1: the record of video 'good' has sha256 'abc'"):
        CodeStore(store).load("good")


def test_codes_outside_the_vocabulary_are_refused_by_the_store_naming_the_file(store):
    np.save(store / "tokens" / "bad.npy", np.full((1, 256), 9000, np.int64))
    assert CodeStore(store).load("bad").max() == 9000  # without n_codes the caller checks (encode_example does)
    with pytest.raises(CodesError, match=rf"cached codes {store / 'tokens' / 'bad.npy'} hold codes in \[9000, 9000\]"):
        CodeStore(store, n_codes=8192).load("bad")
