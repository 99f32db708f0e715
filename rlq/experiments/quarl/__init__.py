"""QuaRL experiments (QuaRL / ActorQ): what the QuaRL notebooks call, re-exported from the modules that hold it.

- :mod:`~rlq.experiments.quarl.run_specs`: :class:`RunSpec` reads a notebook's ``runs`` entries (algorithm,
  environment, steps or ``"zoo"``, hyperparameters; rl-zoo3's settings through :mod:`rlq.rl.zoo`).
- :mod:`~rlq.experiments.quarl.evaluation`: :func:`evaluate_episodes` (many seeded episodes side by side),
  :func:`solved_threshold` (when an fp32 agent has solved its task).
- :mod:`~rlq.experiments.quarl.ptq_sweep` (``quarl_ptq``): :func:`evaluate_ptq` (every run and seed trained in
  parallel and evaluated at every precision, kernel int8 apart from the weights-only sweep, beside the matched
  noise control; cached in each agent's folder so a resumed run does not evaluate again), :func:`ptq_summary`,
  :func:`noise_control_table`, :func:`ptq_estimates`, :func:`precision_intervals`, :func:`ptq_numbers`.
- :mod:`~rlq.experiments.quarl.qat_vs_ptq` (``quarl_qat``): :func:`ptq_after_training` (the fp32 agent and its PTQ
  evaluation), :func:`qat_agent` (one QAT agent), :func:`qat_seed` (both for one run and seed),
  :func:`qat_vs_ptq` (every run and seed, in parallel), :func:`qat_summary`, :func:`qat_vs_ptq_table`,
  :func:`qat_estimates`, :func:`qat_numbers`.
- :mod:`~rlq.experiments.quarl.network_benchmarks` (``quarl_latency``): :func:`network_spaces`, :func:`benchmark_networks`.
- :mod:`~rlq.experiments.quarl.actorq` (``quarl_actorq``): :func:`train_actorq`, :func:`actorq_summary`,
  :func:`actor_breakdown`, :func:`learner_breakdown`, :func:`speedup`,
  :func:`actorq_numbers`.
- :mod:`~rlq.experiments.quarl.regimes` (``quarl_actorq``): :func:`train_regimes`, :func:`regime_runs`,
  :func:`regime_comparison` (measured speedup beside :func:`rlq.actorq.predict_speedup`'s), :func:`regime_estimates`,
  :func:`paper_setting_curve`.
- :mod:`~rlq.experiments.quarl.convergence` (``quarl_actorq``'s convergence section; imported as a module, not
  re-exported): time to return, return at equal steps, the convergence claims' estimates.
- :mod:`~rlq.experiments.quarl.quantization_figures`: their Plotly figures
  (``from rlq.experiments.quarl import quantization_figures``; not re-exported here, so importing the package
  does not import Plotly).
"""

from rlq.experiments.quarl.actorq import (
    actor_breakdown,
    actorq_numbers,
    actorq_summary,
    learner_breakdown,
    task_name,
    train_actorq,
)
from rlq.experiments.quarl.evaluation import solved_threshold
from rlq.experiments.quarl.network_benchmarks import benchmark_networks, network_spaces
from rlq.experiments.quarl.ptq_sweep import (
    evaluate_ptq,
    noise_control_table,
    precision_intervals,
    ptq_estimates,
    ptq_numbers,
    ptq_summary,
)
from rlq.experiments.quarl.qat_vs_ptq import (
    qat_estimates,
    qat_numbers,
    qat_summary,
    qat_vs_ptq,
    qat_vs_ptq_table,
)
from rlq.experiments.quarl.regimes import (
    first_factor_reaching,
    paper_setting_curve,
    regime_comparison,
    regime_estimates,
    regime_numbers,
    regime_runs,
    train_regimes,
)
from rlq.experiments.quarl.run_specs import parse_runs

__all__ = [
    "actor_breakdown",
    "actorq_numbers",
    "actorq_summary",
    "benchmark_networks",
    "evaluate_ptq",
    "first_factor_reaching",
    "learner_breakdown",
    "network_spaces",
    "noise_control_table",
    "paper_setting_curve",
    "parse_runs",
    "precision_intervals",
    "ptq_estimates",
    "ptq_numbers",
    "ptq_summary",
    "qat_estimates",
    "qat_numbers",
    "qat_summary",
    "qat_vs_ptq",
    "qat_vs_ptq_table",
    "regime_comparison",
    "regime_estimates",
    "regime_numbers",
    "regime_runs",
    "solved_threshold",
    "task_name",
    "train_actorq",
    "train_regimes",
]
