"""Probes: one-question measurements, run by hand, that are not workloads of ``python -m bench``.

Each answers one question about where time goes, for the engineer changing
that path; none feeds the bench's table, ratios or targets.

* ``python -m bench.probes.append_cpu [ITEMS ...]``: how much CPU an append costs with the sync taken
  out (on tmpfs), and with ``--profile`` where it goes.
* ``python -m bench.probes.tail_probe [N]``: which appends make the tail latency: back-to-back appends
  to one conversation, timed apart by class (during an extend-ahead job, growing the file, the rest).
* ``python -m bench.probes.newconv_probe``: where a first append's time goes, in the engine.
* ``python -m bench.probes.newconv_floor``: the system-call floor of a first append (creating the
  conversation's directories and segment by hand).
* ``python -m bench.probes.recall_probe``: microseconds per recall against the tuned SQLite, and
  against another copy of logstore (``--baseline DIR``) to compare two trees.
* ``python -m bench.probes.pg_prepared [--prepared-max M]``: how many statements stay prepared on one
  PostgreSQL connection serving sites in all 16 partitions of ``memories``, and the calls' latency.
* ``python -m bench.probes.pg_standby_feedback [--interval S]``: how long an idle standby's
  ``hot_standby_feedback`` keeps the primary from removing rows a new transaction deletes.
* ``python -m bench.probes.xproc_read [--gap S]``: how long a read in one process waits right after
  another process's append to the same conversation (a lone append, or a busy conversation's).
* ``python -m bench.probes.manifest_recovery [N]``: what the power-cut safe listing costs: first
  appends per epoch, and the first listing after a reboot.
"""
