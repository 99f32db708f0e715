"""rlq.experiments: everything around the experiment notebooks.

- ``registry``: the notebooks, their parameters and presets; ``constraints``: the parameters' constraints;
  ``runner``: papermill execution; ``run_folders``: run folders and ``record``; ``results``: published
  results under ``data/results/``; ``paths``: where notebooks, data and runs live.
- ``paper``: the papers' numbers; ``claim_spec``, ``claim_measure``, ``claim_verdicts``: each claim, our number
  and its verdict; ``seed_statistics``: interval estimates over seeds.
- ``gst``, ``quarl``: the per-paper tables and figures that notebooks call; ``pareto``: the Pareto tables of
  ``combo_sparse_quant``; ``notebook_jobs``: a notebook's per-run function over its jobs; ``shared_figures``:
  the Plotly figures they share.

Nothing below this package (compress, quant, rl, sb3, actorq, vision) imports it.
"""
