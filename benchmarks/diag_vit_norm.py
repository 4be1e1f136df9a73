"""Why do fused LayerNorms lose inside timm ViT-B/16 (policy=faster measured 0.54x / 0.84x per kind) when the
same shape alone (64 x 197 x 768 bf16) runs 2.2x faster than eager?  One device call: timm ViT-B/16, bf16,
batch 64, AdamW; unfused vs layer_norm-only swap vs attention-only swap, 15 interleaved rounds x 4 steps
(CUDA events), then a torch.profiler trace of 3 steps of each: top CUDA kernels and top CPU ops.
    python benchmarks/diag_vit_norm.py --out $OUT
"""
import argparse, json, sys, pathlib, time
sys.path.insert(0, str(pathlib.Path(__file__).parent))

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=15)
args = ap.parse_args()
out = pathlib.Path(args.out); out.mkdir(parents=True, exist_ok=True)

import timm
from fused_layers import swap_modules

def make(kinds):
    torch.manual_seed(0)
    m = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000).cuda().to(torch.bfloat16).train()
    rep = swap_modules(m, kinds=kinds) if kinds else None
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, fused=True)
    return m, opt, rep

g = torch.Generator().manual_seed(1)
x = torch.randn(64, 3, 224, 224, generator=g).cuda().to(torch.bfloat16)
y = torch.randint(0, 1000, (64,), generator=g).cuda()
variants = {"unfused": make(None), "layer_norm": make(["layer_norm"]), "attention": make(["attention"])}
for n, (m, o, r) in variants.items():
    if r is not None:
        print(n, "swapped", len(r.swapped))

def step(m, o):
    loss = torch.nn.functional.cross_entropy(m(x).float(), y)
    loss.backward(); o.step(); o.zero_grad(set_to_none=True)

for n, (m, o, r) in variants.items():
    for _ in range(5): step(m, o)
torch.cuda.synchronize()
times = {n: [] for n in variants}
for _ in range(args.rounds):
    for n, (m, o, r) in variants.items():
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(4): step(m, o)
        e.record(); torch.cuda.synchronize()
        times[n].append(s.elapsed_time(e) / 4)
res = {}
for n, t in times.items():
    t = sorted(t); med = t[len(t) // 2]
    res[n] = dict(median_ms=med, min=t[0], max=t[-1])
    print(f"{n:12s} {med:7.2f} ms/step [{t[0]:.2f}-{t[-1]:.2f}]  vs unfused {res['unfused']['median_ms'] / med:.3f}x")
# host time of one step (no GPU wait): CPU-side cost
for n, (m, o, r) in variants.items():
    torch.cuda.synchronize(); t0 = time.perf_counter(); step(m, o); t1 = time.perf_counter(); torch.cuda.synchronize()
    res[n]["host_ms_one_step"] = (t1 - t0) * 1e3
    print(f"{n:12s} host (enqueue) {1e3 * (t1 - t0):.2f} ms")
from torch.profiler import profile, ProfilerActivity
for n, (m, o, r) in variants.items():
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(3): step(m, o)
        torch.cuda.synchronize()
    ka = p.key_averages()
    t1 = ka.table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=70)
    t2 = ka.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=70)
    (out / f"prof_{n}.txt").write_text(t1 + "\n\n" + t2)
    print(f"=== {n}: top CUDA\n{t1[:5000]}")
(out / "diag_vit.json").write_text(json.dumps(res, indent=1))
