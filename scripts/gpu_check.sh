#!/usr/bin/env bash
# The GPU check in one call (scripts/gpu_check.py says what runs and what it writes: four files,
# within what the device tool brings back from $OUT).
#
# Here, before a device run: collect the wheels the device lacks into .whl/, and make the plans the
# train and memory parts compare against (lwm-plan needs no GPU; 30-60 s here) into .gpu_check/
#     ../shared/scripts/gpu-wheels.sh            # hydra-core, omegaconf, antlr4, decord
#     python scripts/gpu_check.py --plan-ahead
# On the device (the device tool, carry [".whl", ".gpu_check"], timeout_s 600; the parts end within
# 8 minutes; without .gpu_check/ each part plans on the device first):
#     bash scripts/gpu_check.sh
# Afterwards, here: copy the numbers into docs/benchmarks.md
#     python scripts/gpu_check.py --record <files_at>/benchmarks.md
# The plumbing on CPU in seconds (tests/integration/test_gpu_check.py runs this in CI):
#     bash scripts/gpu_check.sh --dry-run --out /tmp/gpu_check
#
# Carried wheels never shadow the device's own packages: a wheel of a distribution the device
# already has is skipped (and named), so torch, numpy, pytest and its plugins stay the device's
# matched set; carry only what it lacks (its list: the device tool's KINDS.md; it has pytest,
# pluggy, iniconfig and tabulate). The carried site goes first on PYTHONPATH only for what it
# adds. The tests part also runs with PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 (gpu_check.py): the
# device's pytest plugins are not needed, and one that breaks on import would stop collection.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
  # A wheel's file name starts with its distribution's name; keep those not installed here.
  mapfile -t wanted < <("$python" - .whl/*.whl <<'EOF'
import importlib.metadata as md, sys
from pathlib import Path
for wheel in sys.argv[1:]:
    try:
        have = md.version(Path(wheel).name.split("-")[0])
        print(f"gpu_check: not installing {Path(wheel).name}: this machine has {have}", file=sys.stderr)
    except md.PackageNotFoundError:
        print(wheel)
EOF
  )
  if ((${#wanted[@]})); then
    site="${TMPDIR:-/tmp}/lwm-gpu-site"
    "$python" -m pip install -q --no-index --no-deps --upgrade --target "$site" "${wanted[@]}" \
      || echo "gpu_check: installing .whl/ failed; going on with what is installed" >&2
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project itself, without installing it
exec "$python" scripts/gpu_check.py "$@"
