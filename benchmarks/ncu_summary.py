"""Summarise benchmarks/gpu_attention_ncu.sh's Nsight Compute CSV (details page) into one markdown table.
    python benchmarks/ncu_summary.py benchmarks/results/issue13/ncu/ncu_attention.csv > .../ncu_attention.md
Kernels come in launch order: per case (diag_attention_ncu.CASES, or the NCU_CASES the device script passed, in
the environment) ours (fwd, preprocess, dK/dV, dQ: Triton or Gluon kernels), then cuDNN's; a case ends where a
kernel of ours follows one of cuDNN's.  Matmul FLOPs each kernel does (B*H*S^2*D units, halved when causal): fwd 4 (QK^T, PV);
our dK/dV 8 (QK^T again, dV += P^T dO, dP = dO V^T, dK += dS^T Q); our dQ 6 (QK^T, dO V^T again, dQ = dS K);
cuDNN bwd 10 (one pass: dQ accumulated across key blocks).  'useful' TFLOP/s counts the standard
4 (fwd) / 10 (bwd) of FlashAttention accounting over the whole pass, so recomputation shows as a loss."""
import csv, io, os, sys


def parse_cases(items):
    """Cases as (D, S, causal) from "D,S,causal" strings (causal 0 / 1)."""
    return [(int(d), int(n), bool(int(c))) for d, n, c in (a.split(",") for a in items)]


CASES = parse_cases(os.environ["NCU_CASES"].split()) if os.environ.get("NCU_CASES") else [(128, 4096, False), (64, 1024, True)]
H, TOKENS = 16, 16384


def load(path):
    txt = open(path).read().splitlines()
    i = next(i for i, l in enumerate(txt) if l.startswith('"ID"'))
    rows = list(csv.DictReader(io.StringIO("\n".join(l for l in txt[i:] if l.startswith('"')))))
    ks = {}
    for r in rows:
        k = ks.setdefault(int(r["ID"]), {"name": r["Kernel Name"]})
        if r["Metric Name"]:
            k[r["Metric Name"]] = r["Metric Value"]
    return [ks[i] for i in sorted(ks)]


def num(k, m):
    v = k.get(m, "").replace(",", "")
    try:
        return float(v)
    except ValueError:
        return float("nan")


def main(path):
    ks = load(path)
    groups, prev_cudnn = [], True
    for k in ks:
        is_cudnn = "cudnn" in k["name"]
        if not is_cudnn and prev_cudnn:
            groups.append([])
        groups[-1].append(k)
        prev_cudnn = is_cudnn
    print("| case | kernel | us | matmul TFLOP/s (own FLOPs) | SM busy % | issue slots busy % | gmma inst % of peak | "
          "warp cycles / issued inst | occupancy achieved / theor. % | regs/thread | smem/block KiB | block limit (regs, smem) | L2 hit % | DRAM % |")
    print("|" + "---|" * 14)
    for c, (D, S, causal) in enumerate(CASES):
        B = TOKENS // S
        unit = B * H * S * S * D * (0.5 if causal else 1.0)
        group = groups[c] if c < len(groups) else []
        totals = {}
        for k in group:
            n = k["name"]
            who = "cudnn" if "cudnn" in n else "ours"
            short = ("cudnn " + ("fwd" if "fprop" in n else "bwd")) if who == "cudnn" else n.replace("_attn_", "").replace("_kernel", "")
            part = "fwd" if ("fwd" in short or "fprop" in n) else "bwd"
            if who == "cudnn":
                units = 4 if part == "fwd" else (10 if "bprop" in n else 0)
            else:  # our forwards (Triton or Gluon), dK / dV (recomputes QK^T), dQ (recomputes QK^T and dO V^T)
                units = 4 if part == "fwd" else 8 if "dkdv" in short else 6 if "dq" in short else 0
            flops = units * unit
            us = num(k, "Duration") / 1e3
            totals[(who, part)] = totals.get((who, part), 0.0) + us
            tf = f"{flops / us / 1e6:.0f}" if flops else "-"
            print(f"| D{D} S{S} {'causal' if causal else 'non-causal'} | {short} | {us:.0f} | {tf} | {num(k, 'Compute (SM) Throughput'):.0f} | "
                  f"{num(k, 'Issue Slots Busy'):.0f} | {num(k, 'sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active'):.1f} | "
                  f"{num(k, 'Warp Cycles Per Issued Instruction'):.1f} | {num(k, 'Achieved Occupancy'):.1f} / {num(k, 'Theoretical Occupancy'):.1f} | "
                  f"{num(k, 'Registers Per Thread'):.0f} | {(num(k, 'Dynamic Shared Memory Per Block') + num(k, 'Static Shared Memory Per Block')) / 1024:.0f} | "
                  f"{num(k, 'Block Limit Registers'):.0f}, {num(k, 'Block Limit Shared Mem'):.0f} | {num(k, 'L2 Hit Rate'):.0f} | {num(k, 'DRAM Throughput'):.0f} |")
        for part, std in (("fwd", 4), ("bwd", 10)):
            o, d = totals.get(("ours", part)), totals.get(("cudnn", part))
            if o and d:
                print(f"| D{D} S{S} {'causal' if causal else 'non-causal'} | **{part} total** | ours {o:.0f} / cuDNN {d:.0f} | "
                      f"useful {std * unit / o / 1e6:.0f} / {std * unit / d / 1e6:.0f} | ours/cuDNN speed {d / o:.2f} |" + " |" * 9)


if __name__ == "__main__":
    main(sys.argv[1])
