# Sourced by the norm ncu device scripts (gpu_session25_c.sh, gpu_session26_g.sh): ncu_norm REGEX TIMEOUT profiles
# benchmarks/ncu_norm_gluon.py (its cases: NCU_CASES) into $OUT/ncu_norm.csv and writes $OUT/ncu_norm_summary.txt.
ncu_norm() {
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1 || ls /usr/local/cuda/bin/ncu)
  timeout $2 $NCU --clock-control none --profile-from-start off --kernel-name regex:$1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section MemoryWorkloadAnalysis \
    --metrics smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio \
    --csv --page details --log-file $OUT/ncu_norm.csv python3 benchmarks/ncu_norm_gluon.py > $OUT/ncu_norm.log 2>&1
  el "ncu exit $?"; tail -3 $OUT/ncu_norm.log; wc -l $OUT/ncu_norm.csv
  python3 - $OUT/ncu_norm.csv <<'PY' | tee $OUT/ncu_norm_summary.txt
  import csv, sys
  rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
  hdr = rows[0]; ki = hdr.index("Kernel Name"); ii = hdr.index("ID"); mi = hdr.index("Metric Name"); vi = hdr.index("Metric Value"); ui = hdr.index("Metric Unit")
  want = ("Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput", "Issued Warp Per Scheduler", "No Eligible", "Active Warps Per Scheduler", "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction", "Executed Instructions", "Registers Per Thread", "Achieved Occupancy", "L1/TEX Hit Rate", "L2 Hit Rate", "Mem Busy", "Max Bandwidth")
  cur = None
  for r in rows[1:]:
      if (r[ii], r[ki]) != cur:
          cur = (r[ii], r[ki]); print("\n#", r[ii], r[ki][:60])
      if r[mi] in want or r[mi].startswith("Stall") or "stall" in r[mi].lower():
          print(f"  {r[mi]}: {r[vi]} {r[ui]}")
PY
}
