"""One TMA softmax forward launch under ncu (benchmarks/gpu_session23_b.sh): warmed up first, then profiled between
cudaProfilerStart / Stop.   ncu --profile-from-start off ... python3 benchmarks/ncu_softmax_gluon.py --width N --config a,b,..
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch

from fused_layers.ops import softmax_gluon as SG

ap = argparse.ArgumentParser()
ap.add_argument("--width", type=int, default=32768)
ap.add_argument("--config", default="")
a = ap.parse_args()
cfg = tuple(int(v) for v in a.config.split(",")) if a.config else None
x = torch.randn(2**26 // a.width, a.width, device="cuda", dtype=torch.bfloat16) * 4
for _ in range(3):
    SG.softmax_forward_tma(x, cfg)
torch.cuda.synchronize()
torch.cuda.profiler.start()
SG.softmax_forward_tma(x, cfg)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
