"""asv benchmarks for nqdq (see ../asv.conf.json). Benchmarks time the installed nqdq;
set-up does a warm-up call so that one-time costs (imports, JIT compilation) stay out."""
