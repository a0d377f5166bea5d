#!/usr/bin/env bash
# The GPU check in one call (scripts/gpu_check.py says what runs and what it writes).
#
# Here, before a device run: collect the wheels the device lacks into .whl/
#     ../shared/scripts/gpu-wheels.sh pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 tabulate==0.10.0
# On the device (the device tool, carry [".whl"], timeout_s 600; the parts end within 8 minutes):
#     bash scripts/gpu_check.sh
# Afterwards, here: copy the numbers into docs/benchmarks.md
#     python scripts/gpu_check.py --record <files_at>/benchmarks.md
# The plumbing on CPU in seconds (tests/test_gpu_check.py runs this in CI):
#     bash scripts/gpu_check.sh --dry-run --out /tmp/gpu_check
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
  site="${TMPDIR:-/tmp}/lwm-gpu-site"
  "$python" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl \
    || echo "gpu_check: installing .whl/ failed; going on with what is installed" >&2
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project itself, without installing it
exec "$python" scripts/gpu_check.py "$@"
