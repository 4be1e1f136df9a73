#!/usr/bin/env bash
# Session 23, call 9 (< 4 min, one H200).  After the cross-entropy default changed (TMA HOLD for 16-bit rows of at
# most 32,768 classes): the integration (HF / timm look-alikes, causal-LM loss), compile and swap / callback GPU tests.
#   run: OUT=$OUT bash benchmarks/gpu_session30_i.sh   (carry .whl)
set -u
source benchmarks/_gpu_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 && export PYTHONPATH=/tmp/site:$PYTHONPATH
timeout 200 python3 -m pytest tests/test_integrations.py tests/test_compile_gpu.py tests/test_callback.py tests/test_swap.py -m gpu -n 8 -q -p no:cacheprovider > $OUT/tests.log 2>&1
el "tests exit $?"; tail -2 $OUT/tests.log; grep -E "^FAILED|^E  " $OUT/tests.log | head -20
