#!/usr/bin/env bash
# Issue 13: Nsight Compute counters of ours vs cuDNN (benchmarks/diag_attention_ncu.py); one device call.
# Results: $OUT/ncu_attention.csv (details page, one row per metric per kernel), $OUT/ncu_attention.log,
# $OUT/ncu_attention.md (the summary made by benchmarks/ncu_summary.py on this machine).
set -u
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1 || ls /usr/local/cuda/bin/ncu)
echo "ncu: $NCU"; $NCU --version | tail -1
export PYTHONPATH=.
$NCU --query-metrics --chip gh100 2> /dev/null | grep -iE "gmma|tensor" > $OUT/ncu_metrics_avail.txt
WANT=""
for m in sm__pipe_tensor_op_gmma_cycles_active sm__inst_executed_pipe_tensor_op_gmma; do
  grep -q "^$m " $OUT/ncu_metrics_avail.txt && WANT="$WANT,$m.avg.pct_of_peak_sustained_active"
done
M=""; [ -n "$WANT" ] && M="--metrics ${WANT#,}"
echo "extra metrics: $M"
timeout ${NCU_LIMIT:-330} $NCU --clock-control none --profile-from-start off --target-processes all \
  --kernel-name 'regex:_attn|cudnn|sdpa|flash' \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section MemoryWorkloadAnalysis \
  $M \
  --csv --page details --log-file $OUT/ncu_attention.csv python3 benchmarks/diag_attention_ncu.py ${NCU_CASES:-} > $OUT/ncu_attention.log 2>&1
echo "ncu exit $?"; tail -5 $OUT/ncu_attention.log; wc -l $OUT/ncu_attention.csv
grep -E "Kernel Name|^\"" $OUT/ncu_attention.csv | awk -F'","' '{print $5}' | sort | uniq -c | head -20
