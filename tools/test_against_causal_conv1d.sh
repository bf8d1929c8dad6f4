#!/usr/bin/env bash
# causal-conv1d's own test file, run against conv1d_silu.compat.install() (its tests need a CUDA GPU):
#   tools/test_against_causal_conv1d.sh PATH/TO/test_causal_conv1d.py [pytest arguments...]
# The file is given at run time: nothing of causal-conv1d is part of this repository. install() runs
# before pytest imports the file, so its `from causal_conv1d... import ...` lines get the shim.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -f "$1" ]; then
  echo "usage: $0 PATH_TO_TEST_FILE [pytest arguments...]" >&2
  exit 2
fi
test_file=$(realpath "$1")
shift
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# -c /dev/null and --rootdir: the file runs under pytest's defaults, not this repository's settings
exec python3 - "$test_file" "$@" <<'PY'
import sys
from pathlib import Path

import pytest

import conv1d_silu.compat

conv1d_silu.compat.install()
test_file, args = sys.argv[1], sys.argv[2:]
sys.exit(pytest.main([test_file, "-c", "/dev/null", "--rootdir", str(Path(test_file).parent), "-p", "no:cacheprovider", *args]))
PY
