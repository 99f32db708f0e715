"""rlq.experiments: everything around the experiment notebooks.

- ``registry``: the notebooks, their parameters and presets; ``runner``: papermill execution;
  ``runs``: run folders and ``record``; ``results``: published results under ``data/results/``;
  ``paths``: where notebooks, data and runs live.
- ``paper``: the papers' numbers; ``claims``: each claim's rule; ``compare``: comparisons against seed noise.
- ``gst``, ``quarl``: the per-paper orchestration that notebooks call; ``figures``: shared Plotly figures.

Nothing below this package (compress, quant, rl, sb3, actorq, vision) imports it.
"""
