#!/usr/bin/env bash
# Session 11 (2026-12-02), fourth call.  Issue 9: the LayerNorm / RMSNorm backward had left the C++ fast path
# (two backward plans since the persistent kernel's persist_ok key: the registered one never compiled; run16_c
# host_h200.md LN fwd+bwd 2.13x PyTorch).  Fixed: the C++ GPU tests, the norm GPU tests with the BWD_PERSIST
# defaults (16K-128K), the host cost again, and GPT-2 small eager fused vs SDPA (step / GPU time).
#   run: OUT=$OUT bash benchmarks/gpu_session16_d.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 150 python3 -c "from fused_layers.ops import _cpp; print('extension', _cpp.extension(wait=True) is not None)" > $OUT/build.log 2>&1
el "build exit $?"; tail -1 $OUT/build.log
timeout 130 python3 -m pytest tests/test_cpp_fastpath.py -q -m gpu -x -k "cpp_node or wide_rows_stay or fast_call" -p no:cacheprovider > $OUT/cpp_tests.log 2>&1
el "C++ GPU tests exit $?"; tail -2 $OUT/cpp_tests.log; grep -E "^FAILED|Error" $OUT/cpp_tests.log | head -5
timeout 100 python3 -m pytest tests/test_layer_norm.py -q -m gpu -k "persistent or shared" -p no:cacheprovider > $OUT/ln_tests.log 2>&1
el "LN GPU tests exit $?"; tail -2 $OUT/ln_tests.log; grep -E "^FAILED" $OUT/ln_tests.log | head -5
timeout 100 python3 benchmarks/bench_host.py --out /tmp/host --rounds 3 --calls 1000 > $OUT/host.log 2>&1
el "host exit $?"; cp /tmp/host/host_h200.md $OUT/ 2>/dev/null; grep -E "^\| (layer|rms|softmax|attention)" $OUT/host.log
timeout 120 python3 benchmarks/bench_e2e.py --out /tmp/e2e --variants unfused_sdpa,fused --rounds 5 --steps 8 --profile-steps 2 > $OUT/e2e.log 2>&1
el "e2e exit $?"; cp /tmp/e2e/e2e_h200*.md $OUT/ 2>/dev/null; grep -E "^\| (fused|unfused)" /tmp/e2e/e2e_h200*.md | head -4
