"""Issue 10 (session 23): the wide softmax backward op (softmax_backward(y, dy)) at widths not a multiple of 16, the
default (persistent) against the piece-wise kernels (wide_mode 0); bf16, 2^26 elements, do_bench (L2 flushed) and
CUDA-graph replay, fraction of the 4.22 TB/s copy for two reads and one write; max error against float32 torch.

    python3 benchmarks/sweep_softmax_bwd_odd.py [N ...] > $OUT/sm_bwd_odd.txt
    FORMS='{"vec8 off": {"misaligned_vec8": false}}' python3 ...   # the default, then these forms, then the default
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch

import _timing
from fused_layers.ops import _cpp
from fused_layers.ops._common import config_override
from fused_layers.ops.softmax import softmax_backward

_cpp.extension(wait=True)
for n in [int(a) for a in sys.argv[1:]] or [50257, 32001, 100277, 50304]:
    x = torch.randn(2**26 // n, n, device="cuda") * 3
    y = torch.softmax(x, -1).to(torch.bfloat16)
    dy = torch.randn_like(y)
    ref = torch._softmax_backward_data(dy.float(), y.float(), 1, torch.float32)
    nb = 3 * y.numel() * y.element_size()
    forms = {"piece-wise (wide_mode=0)": dict(wide_mode=0)}
    if os.environ.get("FORMS"):
        forms = json.loads(os.environ["FORMS"])
    for label, cfg in (("default", {}), *forms.items(), ("default again", {})):
        with config_override("softmax", **cfg):
            f = lambda: softmax_backward(y, dy, 1)  # noqa: E731
            err = (f().float() - ref).abs().max().item()
            d, g = _timing.fractions_of_copy(f, nb)
        print(f"N={n:6d} {label:26s} do_bench {d:.3f}  graph {g:.3f}  err {err:.1e}", flush=True)
