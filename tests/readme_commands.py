"""The README's launch commands, as the tests run them: a line of a ```bash block that starts with
a given prefix, split as the shell would (without its trailing comment)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_command(prefix: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    lines = [line for block in blocks for line in block.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"README.md should have one ```bash line starting {prefix!r}, has {lines}"
    return shlex.split(lines[0], comments=True)
