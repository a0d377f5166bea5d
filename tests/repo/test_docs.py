"""The README and docs/ speak to users: no development talk (the circumstances the docs were written
in, commit hashes as evidence), every relative link reaches a file and every #anchor a heading, no
section is written twice (within a file or between files), and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lwm.paths import REPO

ROOT = REPO
README_MAX_LINES = 300
# Phrases about how the project was developed, not about the project; case-insensitive.
REFUSED = {
    "this session": r"\bthis session\b",
    "a machine that was lent": r"\b(?:was|were|been|is|are) lent\b",
    "the device tool": r"\bdevice tool\b",
    "what a tool brings back": r"\bbrings? back \d+",
    "a commit hash": r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b",
    "a commit named as evidence": r"\bcommits? [0-9a-f]{7,40}\b",
}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def name(doc: Path) -> str:
    return str(doc.relative_to(ROOT)) if doc.is_relative_to(ROOT) else doc.name


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside ``` fences."""
    out, fenced = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((i, line))
    return out


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) for every heading outside code fences; the body runs to the next heading."""
    found: list[tuple[str, list[str]]] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.+)", line)
        if heading:
            found.append((heading.group(1).strip(), []))
        elif found:
            found[-1][1].append(line)
    return [(h, " ".join(" ".join(body).split())) for h, body in found]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def refused_phrases(doc: Path) -> list[str]:
    text = doc.read_text()
    return [
        f"{name(doc)}:{text.count(chr(10), 0, m.start()) + 1}: {what} ({m.group()!r})"
        for what, pattern in REFUSED.items()
        for m in re.finditer(pattern, text, re.I if what != "a commit hash" else 0)
    ]


def broken_links(doc: Path) -> list[str]:
    bad = []
    for line_no, line in prose(doc.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                bad.append(f"{name(doc)}:{line_no}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in {slug(h) for h, _ in sections(file.read_text())}:
                bad.append(f"{name(doc)}:{line_no}: {target} (no heading #{anchor} in {file.name})")
    return bad


def test_no_development_talk():
    found = [hit for doc in docs() for hit in refused_phrases(doc)]
    assert not found, "the docs speak of how the project was developed:\n" + "\n".join(found)


def test_every_relative_link_resolves():
    bad = [b for doc in docs() for b in broken_links(doc)]
    assert not bad, "links that lead nowhere:\n" + "\n".join(bad)


def repeated(paths: list[Path]) -> list[str]:
    """Headings that occur twice in one file, and sections (heading and body) written in two files."""
    twice, seen = [], {}
    for doc in paths:
        found = sections(doc.read_text())
        headings = [h for h, _ in found]
        twice += [
            f"{name(doc)}: heading {h!r} {headings.count(h)} times"
            for h in sorted(set(headings))
            if headings.count(h) > 1
        ]
        for heading, body in found:
            if body and seen.get((heading, body), name(doc)) != name(doc):
                twice.append(f"{name(doc)} repeats section {heading!r} of {seen[heading, body]}")
            seen.setdefault((heading, body), name(doc))
    return twice


def test_no_heading_twice_in_a_file_and_no_section_twice_anywhere():
    twice = repeated(docs())
    assert not twice, "\n".join(twice)


def test_readme_is_short_and_points_to_the_guides():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, f"README.md has {len(text.splitlines())} lines"
    for guide in [
        "training",
        "data",
        "parallelism",
        "planning",
        "evaluation",
        "interop",
        "clusters",
        "gpu",
        "troubleshooting",
    ]:
        assert (ROOT / "docs" / f"{guide}.md").is_file(), guide
        assert f"docs/{guide}.md" in text or guide in (ROOT / "docs" / "README.md").read_text(), guide
    assert "(docs/README.md)" in text


@pytest.mark.parametrize(
    "line, what",
    [
        ("Measured in this session on 2 cores.", "this session"),
        ("No GPU was lent to us.", "a machine that was lent"),
        ("within what the device tool allows", "the device tool"),
        ("it brings back 8 files", "what a tool brings back"),
        ("took 7 min (a7b8c3e, clean clone)", "a commit hash"),
        ("the same as commit 156bd47", "a commit named as evidence"),
    ],
)
def test_a_development_phrase_would_be_caught(tmp_path, line, what):
    doc = tmp_path / "x.md"
    doc.write_text(f"# x\n\n{line}\n")
    assert any(f": {what} (" in hit for hit in refused_phrases(doc))


def test_a_broken_link_and_a_repeated_section_would_be_caught(tmp_path):
    (tmp_path / "a.md").write_text(
        "# A\n\n## Run\n\nbody\n\n## Run\n\n[b](b.md#nowhere) [c](c.md) [s](#run) [b](b.md#run)\n"
    )
    (tmp_path / "b.md").write_text("# B\n\n## Run\n\nbody\n")
    bad = broken_links(tmp_path / "a.md")
    assert len(bad) == 2 and "no heading #nowhere" in bad[0] and "c.md (no such file)" in bad[1]
    twice = repeated([tmp_path / "a.md", tmp_path / "b.md"])
    assert twice == ["a.md: heading 'Run' 2 times", "b.md repeats section 'Run' of a.md"]


def table_rows_short_of_their_header(text: str) -> list[str]:
    """The rows of a Markdown table with fewer or more cells than its header (an escaped \\| is no border)."""
    bad, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = len(re.split(r"(?<!\\)\|", line.strip())) - 2
        if header is None:
            header = cells
        elif cells != header:
            bad.append(f"{cells} cells, header {header}: {line[:100]}")
    return bad


def test_every_table_row_has_its_headers_cells():
    bad = {name(doc): rows for doc in docs() if (rows := table_rows_short_of_their_header(doc.read_text()))}
    assert not bad, bad


def test_a_row_short_of_a_cell_would_be_caught():
    assert table_rows_short_of_their_header("| a | b |\n| --- | --- |\n| `x\\|y` | 2 |\n") == []
    assert len(table_rows_short_of_their_header("| a | b | c |\n| --- | --- | --- |\n| 1 | 2 |\n")) == 1


# The checkout's files and lwm's modules the docs name: tests/unit/core/test_step.py, lwm.core.config.resolve_stage
NAMED_PATH = re.compile(r"(?<![\w./-])((?:lwm|tests|bench|scripts|conf)/[\w/.-]*\w\.(?:py|yaml|sh))\b")
NAMED_MODULE = re.compile(r"(?<![\w./<-])(lwm(?:\.\w+)+)(?![\w<])")
FILE_SUFFIXES = {"json", "md", "txt", "yaml", "py"}  # lwm.json is a file of an export, not a module


def missing_names(doc: Path, root: Path = ROOT) -> list[str]:
    """The paths `doc` names that the checkout lacks, and the lwm.x.y names that are neither a module nor
    a name its longest module prefix defines or imports (read, not imported)."""
    text, bad = doc.read_text(), []
    bad += [f"{name(doc)}: {p} (no such file)" for p in NAMED_PATH.findall(text) if not (root / p).exists()]
    for dotted in NAMED_MODULE.findall(text):
        parts = dotted.split(".")
        if parts[-1] in FILE_SUFFIXES and len(parts) == 2:
            continue
        for k in range(len(parts), 1, -1):
            base = root.joinpath(*parts[:k])
            source = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
            if source.exists():
                rest = parts[k:]
                if rest and not re.search(rf"\b{rest[0]}\b", source.read_text()):  # defined or re-exported
                    bad.append(f"{name(doc)}: {dotted} ({'.'.join(parts[:k])} defines no {rest[0]})")
                break
        else:
            bad.append(f"{name(doc)}: {dotted} (no such module)")
    return bad


def test_every_file_and_module_the_docs_name_exists():
    bad = [b for doc in docs() for b in missing_names(doc)]
    assert not bad, "names of files or modules that are not in the checkout:\n" + "\n".join(bad)


def test_a_moved_file_or_module_would_be_caught(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "lwm/train/step.py, `lwm.train.config.resolve_stage`, lwm.core.config.no_such, lwm.core.config.resolve_stage\n"
    )
    assert missing_names(doc) == [
        "x.md: lwm/train/step.py (no such file)",
        "x.md: lwm.train.config.resolve_stage (lwm.train defines no config)",
        "x.md: lwm.core.config.no_such (lwm.core.config defines no no_such)",
    ]
