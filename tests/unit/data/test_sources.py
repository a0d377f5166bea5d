"""Source files in the forms data is published in (lwm.data.sources): caption tables (CSV and TSV with a
header row) read as Python's csv module reads them, and JSON files holding one array (LLaVA's and
Video-ChatGPT's conversation sets) read as json.load reads them; each example found by one scan that
holds none and read by one seek, bad ones skipped naming their place, a bad header refused before any work."""

from __future__ import annotations

import csv
import json

import pytest

from lwm.data.sources import SourceError, array_elements, check_readable, open_source

CELLS = [
    ["clip.mp4", 'a "quoted", caption'],
    ["two.mp4", "over\ntwo lines"],
    ["tab.mp4", "a\ttab and ünïcode"],
    ["empty.mp4", ""],  # an empty cell: a missing field
]


@pytest.mark.parametrize("kind,dialect,newline", [("csv", "excel", "\r\n"), ("tsv", "excel-tab", "\n")])
def test_rows_are_what_pythons_csv_module_reads(tmp_path, kind, dialect, newline):
    """Written by csv.writer (CRLF or LF, a UTF-8 BOM before the header, a blank line): each row as
    csv.DictReader gives it, empty cells left out, named by the line it starts on; an index's places
    give the same rows without a scan."""
    path = tmp_path / f"caps.{kind}"
    with open(path, "w", newline="", encoding="utf-8-sig") as f:
        writer = csv.writer(f, dialect=dialect, lineterminator=newline)
        writer.writerow(["video", "caption"])
        writer.writerows(CELLS[:2])
        f.write(newline)  # a blank line is no row
        writer.writerows(CELLS[2:])
    with open(path, newline="", encoding="utf-8-sig") as f:
        want = [{k: v for k, v in row.items() if v} for row in csv.DictReader(f, dialect=dialect)]
    reader = open_source(path)
    reader.scan()
    assert reader.format == "table" and reader.columns == ["video", "caption"]
    assert (
        [reader.example(i) for i in range(len(reader))]
        == want
        == [{"video": v, **({"caption": c} if c else {})} for v, c in CELLS]
    )
    assert [reader.where(i) for i in range(len(reader))] == [f"{path}:{n}" for n in (2, 3, 6, 7)]
    again = open_source(path, places=reader.places())
    assert [e for _, e in again.examples(0, len(again))] == want


def test_bad_rows_are_skipped_naming_their_line(tmp_path):
    """A row of the wrong width, one over max_line_bytes (never read), one not UTF-8, and a quote left
    open to the end of the file: each a SourceError naming file and line; the rows between are read."""
    path = tmp_path / "caps.csv"
    path.write_bytes(
        b"video,caption\n"
        b"a.mp4,fine\n"
        b"b.mp4,one,too many\n"
        b"c.mp4," + b"x" * 200 + b"\n"
        b"d.mp4,caf\xe9\n"
        b"e.mp4,also fine\n"
        b'f.mp4,"never closed\nstill open\n'
    )
    reader = open_source(path, max_line_bytes=100)
    reader.scan()
    got = dict(reader.examples(0, len(reader)))
    assert got[0] == {"video": "a.mp4", "caption": "fine"} and got[4] == {"video": "e.mp4", "caption": "also fine"}
    reasons = {i: str(e) for i, e in got.items() if isinstance(e, SourceError)}
    assert reasons == {
        1: f"{path}:3: has 3 cells; the header names 2 columns",
        2: f"{path}:4: 207 bytes, longer than max_line_bytes 100: not read",
        3: f"{path}:5: not UTF-8 (invalid continuation byte at byte 9)",
        5: f"{path}:7: not a table row (unexpected end of data)",
    }


@pytest.mark.parametrize(
    "text,why",
    [("", "is empty"), ("video,video\na,b\n", "must name each column once"), ("video,\na,b\n", "name each column")],
)
def test_a_header_that_does_not_name_its_columns_is_refused(tmp_path, text, why):
    path = tmp_path / "caps.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"data source {path}.*{why}"):
        check_readable(path)


LLAVA = [  # LLaVA-Video / Video-ChatGPT's form: one JSON array of conversations
    {
        "id": "v0",
        "video": "clips/v0.mp4",
        "conversations": [
            {"from": "human", "value": '<video>\nWhat is [shown] {here}, "exactly"? A back\\slash.'},
            {"from": "gpt", "value": "A red ball, ] and }."},
            {"from": "human", "value": "And then?"},
            {"from": "gpt", "value": "It rolls left: ünïcode."},
        ],
    },
    {
        "id": "v1",
        "image": "img/1.jpg",
        "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "A cat."}],
    },
]


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("piece", [1, 3, 16, 1 << 20])
def test_a_json_array_reads_as_json_load_reads_it(tmp_path, indent, piece):
    """Each element of a .json array, found in pieces of any size (strings holding brackets, commas,
    escaped quotes and backslashes; nested lists; one line or indented), equals json.load's; the reader
    is chosen by the file's first byte, and an index's places give the same without a scan."""
    path = tmp_path / "llava.json"
    data = LLAVA + [[1, [2, {"a": "]"}]], "a, string", None]
    path.write_text(json.dumps(data, indent=indent, ensure_ascii=False), encoding="utf-8")
    offsets, sizes = array_elements(path, piece)
    raw = path.read_bytes()
    assert [json.loads(raw[a : a + n]) for a, n in zip(offsets, sizes)] == json.load(open(path)) == data
    reader = open_source(path)
    reader.scan()
    assert reader.format == "array" and [reader.example(i) for i in range(len(reader))] == data
    assert reader.where(1) == f"{path}:element 1"
    again = open_source(path, places=reader.places())
    assert [e for _, e in again.examples(0, len(again))] == data


def test_a_json_arrays_bad_elements_are_skipped_naming_them(tmp_path):
    """An element over max_line_bytes is never read; a file cut short (a killed download) loses only its
    last element; an empty array has none; a .json of JSON lines stays JSON lines."""
    path = tmp_path / "llava.json"
    big = {"id": "big", "conversations": [{"from": "human", "value": "x" * 500}]}
    text = json.dumps([LLAVA[0], big, LLAVA[1]])
    path.write_text(text[:-25])  # the last element cut short
    reader = open_source(path, max_line_bytes=400)
    reader.scan()
    got = dict(reader.examples(0, len(reader)))
    assert len(got) == 3 and got[0] == LLAVA[0]
    assert str(got[1]).startswith(f"{path}:element 1: ") and "longer than max_line_bytes 400: not read" in str(got[1])
    assert str(got[2]).startswith(f"{path}:element 2: not JSON")
    path.write_text(" [ ]\n")
    assert len(array_elements(path)[0]) == 0
    path.write_text("".join(json.dumps(e) + "\n" for e in LLAVA))
    assert open_source(path).format == "jsonl"


def _shard(path, samples, gnu_dirs=False):
    """A webdataset shard written member by member with tarfile: samples = [(key, {ext: bytes})]."""
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        if gnu_dirs:
            tar.addfile(_dir("part"))
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _dir(name):
    import tarfile

    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


def test_a_webdataset_shard_reads_as_its_members_grouped_by_key(tmp_path):
    """Each sample is the members that share a key (the name up to its file name's first dot, folders kept, as
    webdataset groups them), read back from tarfile's own extraction: text members as text, a .json member's
    object (its fields spread where no member has that name), an image member as the reference lwm-tokenize
    reads it by; a long name (a GNU long-name header) and a folder entry read as well; places give the same
    samples without a scan."""
    import tarfile

    from lwm.data.shards import read_member

    samples = [
        ("000001", {"jpg": b"\xff\xd8 one", "txt": b"a cat ", "json": b'{"caption": "from json", "txt": "x", "w": 5}'}),
        ("000002", {"jpg": b"\xff\xd8 two", "seg.png": b"\x89PNG two", "txt": "ünïcode".encode()}),
        ("part/" + "k" * 120, {"txt": b"long name"}),
    ]
    path = _shard(tmp_path / "000000.tar", samples, gnu_dirs=True)
    with tarfile.open(path) as tar:  # the reference: every member of the shard, by tarfile
        contents = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    reader = open_source(path)
    reader.scan()
    assert reader.format == "tar" and len(reader) == 3
    got = [reader.example(i) for i in range(3)]
    assert got[0] == {
        "__key__": "000001",
        "jpg": f"{path}::000001.jpg",
        "txt": "a cat",
        "json": {"caption": "from json", "txt": "x", "w": 5},
        "caption": "from json",
        "w": 5,
    }
    assert got[1]["seg.png"] == f"{path}::000002.seg.png" and got[1]["txt"] == "ünïcode"
    assert got[2] == {"__key__": "part/" + "k" * 120, "txt": "long name"}
    for record in got[:2]:
        for ext in ("jpg", "seg.png"):
            if ext in record:
                assert read_member(record[ext]) == contents[record[ext].split("::")[1]]
    again = type(reader).from_places(path, None, reader.places())
    assert [again.example(i) for i in range(3)] == got


def test_a_corrupt_or_cut_short_shard_skips_what_cannot_be_read_naming_it(tmp_path):
    """A shard cut in the middle of its last member, and one with a damaged header: the samples before are read,
    the rest is one sample that is skipped naming its place (the source's index counts it as any bad example)."""
    samples = [(f"{i:06d}", {"txt": f"caption {i}".encode() * 40, "jpg": bytes(900)}) for i in range(4)]
    whole = _shard(tmp_path / "whole.tar", samples).read_bytes()
    cut = tmp_path / "cut.tar"
    at = 3 * (
        512 + 512 + 512 + 1024
    )  # the fourth sample's first header (each: a header, the text, a header, the image)
    cut.write_bytes(whole[: at + 512 + 512 + 512 + 300])  # inside the last image
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(whole[:at] + b"\x07" * 512 + whole[at + 512 :])
    for path in (cut, damaged):
        reader = open_source(path)
        reader.scan()
        assert len(reader) == 4, path
        assert [reader.example(i)["txt"] for i in range(3)] == [f"caption {i}" * 40 for i in range(3)]
        with pytest.raises(SourceError, match=rf"{path.name}:sample 3: "):
            reader.example(3)


@pytest.mark.parametrize("kind", ["jsonl", "array"])
def test_a_json_sources_misspelt_field_is_refused_before_any_work(tmp_path, kind):
    """JSON records name their own keys: a field none of the first records holds is refused when the source
    is checked, naming it (every record would be skipped as read); one some records lack goes through (those
    are skipped and counted as read), as does a conversation's media column that text-only records lack."""
    from lwm.data import Source

    records = [{"caption": f"a red circle {i}", "vision": f"v{i}"} for i in range(5)] + [{"caption": "no video"}]
    path = tmp_path / ("caps.jsonl" if kind == "jsonl" else "caps.json")
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path.write_text(json.dumps(records, indent=1))
    Source(str(path), fields="[caption],vision").check("caps")
    with pytest.raises(ValueError, match=r"caps: .* none of its first 6 records has a field 'captoin' \(they have "
                       r"\['caption', 'vision'\]\)"):  # fmt: skip
        Source(str(path), fields="[captoin],vision").check("caps")
    # records with a spec of their own are not asked for the source's
    own = tmp_path / "own.jsonl"
    own.write_text("".join(json.dumps({"q": "a?", "a": "b", "fields": "[q],a"}) + "\n" for _ in range(3)))
    Source(str(own), fields="[caption],vision").check("own")
    chats = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}] * 3
    chat = tmp_path / "llava.json"
    chat.write_text(json.dumps(chats))
    Source(str(chat), conversation="conversations", media=["image"]).check("chat")
    with pytest.raises(ValueError, match="chat: .* has a field 'conversation'"):
        Source(str(chat), conversation="conversation", media=["image"]).check("chat")
