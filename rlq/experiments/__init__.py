"""rlq.experiments: running the experiment notebooks.

- ``registry``: the notebooks, their parameters and presets (``presets``); ``constraints``: the parameters'
  constraints; ``runner``: papermill execution; ``notebook_jobs``: a notebook's per-run function over its jobs;
  ``run_folders``: run folders and ``record``; ``reuse``: ``--reuse`` of a published run; ``results``:
  published results under ``data/results/``; ``paths``: where notebooks, data and runs live.
- ``sweeps`` and ``tuner_space``: the sparsity tuner's sweeps and settings; ``wall_time``: a preset's stated
  wall time; ``paper``: the papers' numbers.

The claims and their campaign live in :mod:`rlq.claims`, the tables and figures drawn from results in
:mod:`rlq.analysis`, interval estimates in :mod:`rlq.stats`. Nothing below this package (compress, quant, rl,
sb3, actorq, vision) imports it.
"""
