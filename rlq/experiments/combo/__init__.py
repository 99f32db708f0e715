"""Sparse and low-bit together (``combo_sparse_quant``): GST, gradual pruning, PTQ int8 and QAT composed on TD3.

In the order the notebook calls it:

- :mod:`~rlq.experiments.combo.jobs`: :func:`combo_jobs` lists one training per task, seed and training kind
  (five kinds give the seven methods); :func:`train_all` trains them with checkpoints and resume, deploys
  every derived method and gathers the tables.
- :mod:`~rlq.experiments.combo.methods`: :data:`METHODS`, :data:`TRAININGS`, :data:`DERIVED`; how each method
  is stored, run and timed (:func:`deploy_actor`, :func:`deploy_and_measure`, :func:`measure_side_by_side`).
- :mod:`~rlq.experiments.combo.pareto`: :func:`method_summary` (IQM and interval over seeds, bits, latency
  ratio), :func:`pareto_front`, :func:`with_fronts`, :func:`best_within_dense`, :func:`combo_estimates`,
  :func:`combo_numbers`, :func:`paper_comparison`.
- :mod:`~rlq.experiments.combo.pareto_figures`: the Pareto figures (``from rlq.experiments.combo import pareto_figures``).
"""

from rlq.experiments.combo.jobs import combo_jobs, measure_latencies, train_all, zoo_td3_settings
from rlq.experiments.combo.pareto import (
    combo_estimates,
    combo_numbers,
    method_summary,
    paper_comparison,
    with_fronts,
)

__all__ = [
    "combo_estimates",
    "combo_jobs",
    "combo_numbers",
    "measure_latencies",
    "method_summary",
    "paper_comparison",
    "train_all",
    "with_fronts",
    "zoo_td3_settings",
]
