"""convmem's performance suite: ``python -m bench`` (see ``bench/__main__.py``).

Every workload runs convmem against SQLite (what a user would pick instead)
and against the floor (a plain file with one ``fdatasync`` per batch), in one
process and one run, and reports ratios measured side by side so that they
hold on noisy shared machines. Nothing here is part of the test suite.
"""
