"""convmem's performance suite: ``python -m bench`` (see ``bench/__main__.py``).

Every workload runs convmem against the peers a user would pick instead (a
tuned SQLite, LMDB) and against the floor (``pwrite`` into pre-zeroed space
plus ``fdatasync``), in one process and one run, timing every operation with
the backends taking turns op by op, so that ratios hold on noisy shared
machines. Only ``tests/test_bench_smoke.py`` (a tiny ``--smoke`` run) is part
of the test suite.
"""
