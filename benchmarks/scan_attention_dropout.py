"""Registers and spills of the attention kernels with dropout off / 16-bit / 8-bit masks, AOT-compiled for
sm_90 on a machine without a GPU (``bench_attention._compile_sm90``).

    python benchmarks/scan_attention_dropout.py --out benchmarks/results/issue11

Writes attention_dropout_static_scan_sm90.json (one row per kernel, head dim, config, mask width).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.pop("TRITON_INTERPRET", None)

import bench_attention as BA  # noqa: E402
from fused_layers.ops import attention as A  # noqa: E402
from fused_layers.ops.attention_config import _TABLE  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    kernels = {"fwd": A._attn_fwd_kernel, "dkdv": A._attn_bwd_dkdv_kernel, "dq": A._attn_bwd_dq_kernel}
    for kind, fn in kernels.items():
        for D in (64, 128):
            for causal in (False, True):
                cfgs = list(A._TUNE[kind][D])
                table = _TABLE.get((kind, D, causal))
                if table is not None and table not in cfgs:
                    cfgs.insert(0, table)
                for cfg in cfgs:
                    for bits in (0, 16, 8):
                        cx = dict(VARLEN=False, CAUSAL=causal, HAS_KB=False, BLOCK_D=D, EVEN_D=True, INPUT_PRECISION="tf32",
                                  HAS_DROPOUT=bits)
                        r = BA._compile_sm90(fn, cx, cfg, head_dim=D)
                        row = dict(kernel=kind, D=D, causal=causal, config=list(cfg), table=cfg == table, dropout_bits=bits,
                                   **{k: r.get(k) for k in ("regs", "stack_bytes", "shared_bytes", "error")})
                        rows.append(row)
                        print(row, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_dropout_static_scan_sm90.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
