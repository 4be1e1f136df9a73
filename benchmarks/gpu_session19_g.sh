#!/usr/bin/env bash
# Session 13: the Gluon tile-shape timing of gpu_session19_f.sh alone (its first run spent its time in a deadlocked
# one-stage config, now refused by the launcher). < 3 min.
#   run: OUT=$OUT bash benchmarks/gpu_session19_g.sh
set -u
source benchmarks/_gpu_env.sh
GLUON_CHECKS_FROM=2 timeout 170 python3 benchmarks/bench_attention_gluon.py --out $OUT --budget 125 \
  --configs "${GLUON_CONFIGS:-64:64,128,4,3;64:64,64,4,4;128:64,64,4,3;128:64,64,4,2;128:64,128,4,2}" > $OUT/gluon.log 2>&1
el "gluon exit $?"; grep -E "checks done|^\| " $OUT/gluon.log | head -30
