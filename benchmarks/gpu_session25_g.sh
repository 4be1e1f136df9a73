#!/usr/bin/env bash
# Session 18, call 7 (< 2 min, one H200).  Issue 9: where the 16K norm fwd+bwd's host time goes (torch.profiler: CPU
# self time by op and CUDA runtime call), persistent and Gluon backward, against 8K.
#   run: OUT=$OUT bash benchmarks/gpu_session25_g.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
timeout 90 python3 benchmarks/diag_norm_host_prof.py > $OUT/diag_norm_host_prof.txt 2>&1
el "prof exit $?"; grep -vE "^-+$" $OUT/diag_norm_host_prof.txt | cut -c1-150 | head -90
