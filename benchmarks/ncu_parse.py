"""Summary of Nsight Compute CSVs (``--csv --page details``): one line per kernel with the metrics in ``want``, then
its issue-stall reasons (``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``, warps stalled per
issued instruction) above 0.05, largest first.

    python3 benchmarks/ncu_parse.py DIR      (every DIR/*.csv)
"""
import csv
import glob
import os
import sys

want = ["gpu__time_duration.sum", "Duration", "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct",
        "lts__t_bytes.sum", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput", "Achieved Occupancy",
        "Theoretical Occupancy", "Registers Per Thread", "Block Limit Registers", "Block Limit Shared Mem",
        "Warp Cycles Per Issued Instruction", "Issue Slots Busy", "Avg. Active Threads Per Warp", "Grid Size",
        "Block Size", "Waves Per SM", "L2 Hit Rate", "Mem Busy", "Max Bandwidth", "Executed Ipc Active",
        "Issued Warp Per Scheduler", "No Eligible", "Active Warps Per Scheduler", "Eligible Warps Per Scheduler",
        "sm__inst_executed.sum", "Dynamic Shared Memory Per Block", "Static Shared Memory Per Block"]
STALL = "smsp__average_warps_issue_stalled_"
for f in sorted(glob.glob(sys.argv[1] + "/*.csv")):
    rows = [r for r in csv.reader(open(f)) if len(r) > 14]
    if not rows:
        print(os.path.basename(f), "EMPTY")
        continue
    h = rows[0]
    ki, mi, vi, ui = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("Metric Unit")
    kern = {}
    for r in rows[1:]:
        k = r[ki][:38]
        if "elementwise" in k or "Fill" in k:
            continue
        kern.setdefault((r[0], k), {})[r[mi]] = (r[vi], r[ui])
    print("==", os.path.basename(f))
    for (i, k), d in kern.items():
        print("  ", i, k, " | ".join(f"{m}={d[m][0]}{d[m][1] if d[m][1] not in ('byte', '') else ''}" for m in want if m in d))
        stalls = []
        for m, (v, _) in d.items():
            if m.startswith(STALL) and m.endswith("_per_issue_active.ratio"):
                try:
                    stalls.append((float(v.replace(",", "")), m[len(STALL):-len("_per_issue_active.ratio")]))
                except ValueError:
                    pass
        if stalls:
            print("      stalls/issue:", ", ".join(f"{n} {v:.2f}" for v, n in sorted(stalls, reverse=True) if v >= 0.05))
