import csv, sys, glob, os
want = ["gpu__time_duration.sum","Duration","dram__bytes_read.sum","dram__bytes_write.sum","lts__t_sector_hit_rate.pct","lts__t_bytes.sum",
        "DRAM Throughput","Memory Throughput","Compute (SM) Throughput","Achieved Occupancy","Theoretical Occupancy","Registers Per Thread",
        "Block Limit Registers","Block Limit Shared Mem","Warp Cycles Per Issued Instruction","Issue Slots Busy","Avg. Active Threads Per Warp","Grid Size","Block Size","Waves Per SM", "L2 Hit Rate", "Mem Busy", "Max Bandwidth", "Executed Ipc Active", "Issued Warp Per Scheduler", "No Eligible", "Active Warps Per Scheduler", "Eligible Warps Per Scheduler"]
for f in sorted(glob.glob(sys.argv[1] + "/*.csv")):
    rows = [r for r in csv.reader(open(f)) if len(r) > 14]
    if not rows: print(os.path.basename(f), "EMPTY"); continue
    h = rows[0]; ki, mi, vi, ui = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("Metric Unit")
    kern = {}
    for r in rows[1:]:
        k = r[ki][:38]
        if "elementwise" in k or "Fill" in k: continue
        kern.setdefault((r[0], k), {})[r[mi]] = (r[vi], r[ui])
    print("==", os.path.basename(f))
    for (i, k), d in kern.items():
        print("  ", i, k, " | ".join(f"{m}={d[m][0]}{d[m][1] if d[m][1] not in ('byte','') else ''}" for m in want if m in d))
