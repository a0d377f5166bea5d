"""Print the command of the N-th bash block of the README's "Quick start" section."""

import re
import sys

readme, n = sys.argv[1], int(sys.argv[2])
text = open(readme).read()
section = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.S | re.M)
if not section:
    sys.exit(f"{readme} has no '## Quick start' section")
blocks = re.findall(r"```bash\n(.*?)```", section.group(1), re.S)
if len(blocks) < n:
    sys.exit(f"{readme}'s Quick start has {len(blocks)} bash blocks, not {n}")
print(blocks[n - 1].strip())
