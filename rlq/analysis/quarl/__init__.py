"""QuaRL experiments (QuaRL / ActorQ): the tables and figures the QuaRL notebooks draw.

The notebooks train in their own cells (``quarl_ptq``, ``quarl_qat``, and ``quarl_actorq`` through
:func:`rlq.actorq.train`) or build what they time there (``quarl_latency``); what they share sits below, in
:mod:`rlq.rl` (:class:`rlq.rl.run_spec.RunSpec`, :func:`rlq.rl.evaluate.evaluate_episodes`,
:func:`rlq.rl.evaluate.solved_threshold`) and :mod:`rlq.sb3` (:class:`rlq.sb3.quantized.Quantizer`,
:func:`rlq.sb3.quantized.deployed_qat_policy`).

- :mod:`~rlq.analysis.quarl.quantization_tables`: PTQ's tables per agent, width and seed, and its headline numbers
  (:func:`ptq_summary`, :func:`noise_control_table`, :func:`ptq_estimates`, :func:`precision_intervals`,
  :func:`ptq_numbers`); QAT's summary per method and width (:func:`qat_summary`).
- :mod:`~rlq.analysis.quarl.actorq` (``quarl_actorq``): :func:`actorq_summary`, :func:`actor_breakdown`,
  :func:`learner_breakdown`, :func:`speedup`, :func:`actorq_numbers`.
- :mod:`~rlq.analysis.quarl.regimes` (``quarl_actorq``): :func:`regime_config` (one run's configuration),
  :func:`regime_runs`, :func:`regime_comparison` (measured speedup beside :func:`rlq.actorq.predict_speedup`'s), :func:`regime_estimates`,
  :func:`regime_breakdown` (the actors' time per step by part), :func:`paper_setting_curve`.
- :mod:`~rlq.analysis.quarl.convergence` (``quarl_actorq``'s convergence section; imported as a module, not
  re-exported): time to return, return at equal steps, the convergence claims' estimates.
- :mod:`~rlq.analysis.quarl.quantization_figures`: the Plotly figures that ``rlq report`` also draws from
  committed tables (``from rlq.analysis.quarl import quantization_figures``; not re-exported here, so importing
  the package does not import Plotly).
"""

from rlq.analysis.quarl.actorq import (
    actor_breakdown,
    actorq_numbers,
    actorq_summary,
    learner_breakdown,
    task_name,
)
from rlq.analysis.quarl.quantization_tables import (
    noise_control_table,
    precision_intervals,
    ptq_estimates,
    ptq_numbers,
    ptq_summary,
    qat_summary,
)
from rlq.analysis.quarl.regimes import (
    first_factor_reaching,
    paper_setting_curve,
    regime_breakdown,
    regime_comparison,
    regime_estimates,
    regime_numbers,
    regime_runs,
)

__all__ = [
    "actor_breakdown",
    "actorq_numbers",
    "actorq_summary",
    "first_factor_reaching",
    "learner_breakdown",
    "noise_control_table",
    "paper_setting_curve",
    "precision_intervals",
    "ptq_estimates",
    "ptq_numbers",
    "ptq_summary",
    "qat_summary",
    "regime_breakdown",
    "regime_comparison",
    "regime_estimates",
    "regime_numbers",
    "regime_runs",
    "task_name",
]
