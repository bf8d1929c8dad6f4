#!/usr/bin/env bash
# causal-conv1d's own test file, run against conv1d_silu.compat.install() (its tests need a CUDA GPU):
#   tools/test_against_causal_conv1d.sh PATH/TO/test_causal_conv1d.py [pytest arguments...]
# The file is given at run time: nothing of causal-conv1d is part of this repository. install() runs
# in a pytest plugin (-p), which pytest loads before it imports the file, in every process: the
# xdist workers of -n N too, so each one's `from causal_conv1d... import ...` lines get the shim.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -f "$1" ]; then
  echo "usage: $0 PATH_TO_TEST_FILE [pytest arguments...]" >&2
  exit 2
fi
test_file=$(realpath "$1")
shift
cd "$(dirname "$0")/.."
plugin_dir=$(mktemp -d)
trap 'rm -rf "$plugin_dir"' EXIT
echo 'import conv1d_silu.compat; conv1d_silu.compat.install()' > "$plugin_dir/conv1d_silu_as_causal_conv1d.py"
export PYTHONPATH=$PWD:$plugin_dir${PYTHONPATH:+:$PYTHONPATH}
# -c /dev/null and --rootdir: the file runs under pytest's defaults, not this repository's settings
python3 -m pytest "$test_file" -c /dev/null --rootdir "$(dirname "$test_file")" -p no:cacheprovider \
  -p conv1d_silu_as_causal_conv1d "$@"
