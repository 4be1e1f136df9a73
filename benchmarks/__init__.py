"""fused-layers benchmarks: ``python -m benchmarks <suite>`` (ops, models, train, host, plot, table).

One shared module (``utils``), one module per suite, one results table per suite in ``results/``; see
``benchmarks/README.md``.
"""
