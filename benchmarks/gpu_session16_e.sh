#!/usr/bin/env bash
# Session 11 (2026-12-02), fifth call: issue 9's end-to-end proof after the C++ backward fix (run16_d: s1024 eager
# fused step / GPU 1.048, 1.265x eager SDPA): seq 4096 (B4) eager, s1024 compiled (fused_compile vs compile_sdpa),
# and the host cost with 5 rounds (run16_d LN fwd+bwd 1.17x with 3).
#   run: OUT=$OUT bash benchmarks/gpu_session16_e.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 100 python3 -c "from fused_layers.ops import _cpp; print('extension', _cpp.extension(wait=True) is not None)" > $OUT/build.log 2>&1
el "build exit $?"
timeout 110 python3 benchmarks/bench_e2e.py --out /tmp/e2e --seq-len 4096 --batch-size 4 --variants unfused_sdpa,fused --rounds 5 --steps 8 --profile-steps 1 --tag _s4096 > $OUT/e2e_s4096.log 2>&1
el "e2e s4096 exit $?"; cp /tmp/e2e/e2e_h200_s4096.md $OUT/ 2>/dev/null; grep -E "^\| (fused|unfused)" /tmp/e2e/e2e_h200_s4096.md
timeout 80 python3 benchmarks/bench_host.py --out /tmp/host --rounds 5 --calls 1000 > $OUT/host.log 2>&1
el "host exit $?"; cp /tmp/host/host_h200.md $OUT/ 2>/dev/null; grep -E "^\| (layer|rms|softmax|attention)" $OUT/host.log
timeout 200 python3 benchmarks/bench_e2e.py --out /tmp/e2e --variants compile_sdpa,fused_compile --rounds 3 --steps 8 --profile-steps 1 --tag _compile > $OUT/e2e_compile.log 2>&1
el "e2e compile exit $?"; cp /tmp/e2e/e2e_h200_compile.md $OUT/ 2>/dev/null; grep -E "^\| (fused|compile)" /tmp/e2e/e2e_h200_compile.md
