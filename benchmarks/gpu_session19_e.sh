#!/usr/bin/env bash
# Session 13: one machine start for two things (starts were scarce): issue 13's Gluon forward (gpu_session19_d.sh:
# checks, then timing beside Triton / cuDNN / flash), then the norm GPU tests of the persistent backward with the
# session-13 HOLD defaults. < 7 min.
#   run: OUT=$OUT bash benchmarks/gpu_session19_e.sh   (carry .whl)
set -u
FINAL=$OUT; mkdir -p $FINAL/g $FINAL/n
OUT=$FINAL/g bash benchmarks/gpu_session19_d.sh
source benchmarks/_gpu_env.sh
timeout 100 python3 -m pytest tests/test_layer_norm.py tests/test_attention_gluon.py -q -m gpu -n 8 -p no:cacheprovider -k "persistent or gluon" > $FINAL/n/norm_gpu_tests.log 2>&1
el "norm + gluon GPU tests exit $?"; tail -1 $FINAL/n/norm_gpu_tests.log; grep -E "^FAILED" $FINAL/n/norm_gpu_tests.log | head -20
tar czf $FINAL/results.tgz -C $FINAL g n && rm -rf $FINAL/g $FINAL/n
