#!/usr/bin/env bash
# Executed instructions of the backward by pipe, per kernel-text variant (Nsight Compute, one pass of
# counters each): where the instructions per element go. Run on the device machine:
#   VARIANTS="base no_math no_fold no_tail" CASES="bwd:262144:264:rowgroup_8b_a32" scripts/inst_budget.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/inst-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cache/cupy} PYTHONUNBUFFERED=1
metrics=gpu__time_duration.sum,smsp__inst_executed.sum,sm__inst_executed_pipe_lsu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_xu.sum,sm__inst_executed_pipe_uniform.sum,sm__inst_executed_pipe_adu.sum,sm__inst_executed_pipe_cbu.sum,sm__inst_executed_pipe_fmaheavy.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active
for v in ${VARIANTS:-base}; do
  f=${v//[^A-Za-z0-9_]/_}  # file=PATH variants name files too
  AB_VARIANT=$v timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --profile-from-start off --metrics $metrics \
    -k regex:conv1d_silu_bwd --csv --page raw python3 scripts/profile_kernels.py ${CASES:-bwd:262144:264:rowgroup_8b_a32} \
    > "$OUT/inst_$f.csv" 2> "$OUT/inst_$f.err"
  echo "== $v"; python3 scripts/ncu_extract.py "$OUT/inst_$f.csv" ${metrics//,/ }
done
