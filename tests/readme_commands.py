"""The launch commands the docs show, as the tests run them: a line of a ```bash block of README.md,
docs/clusters.md (where the cluster commands live) or docs/data.md (one per form of data) that starts with a
given prefix, split as the shell would (without its trailing comment)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "clusters.md", ROOT / "docs" / "data.md"]


def readme_command(prefix: str) -> list[str]:
    blocks = [b for doc in DOCS for b in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S)]
    lines = [line for block in blocks for line in block.splitlines() if line.startswith(prefix)]
    names = " and ".join(str(d.relative_to(ROOT)) for d in DOCS)
    assert len(lines) == 1, f"{names} should have one ```bash line starting {prefix!r}, have {lines}"
    return shlex.split(lines[0], comments=True)
