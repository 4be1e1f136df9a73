# Sourced by the benchmarks/gpu_*.sh device scripts: unbuffered Python, the project on PYTHONPATH,
# Liger-Kernel (an optional peer) from the carried wheels when present, and el(): elapsed seconds + a message.
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/liger_kernel*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/liger_kernel*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
# summ LOG: the bench_norm table rows of LOG (op, dtype, width, config, provider, fwd / bwd fraction of copy).
summ() { python3 -c "
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith('{') or '\"cfg\"' not in line: continue
    r = json.loads(line); c = r['cfg']
    if 'bwd_frac' in r:
        print('TABLE', r['op'], r['dtype'], r['n'], c, r.get('provider'), 'fwd', round(r['fwd_frac'], 3), 'bwd', round(r['bwd_frac'], 3))
" $1; }
