"""QuaRL experiments (QuaRL / ActorQ): what the QuaRL notebooks call, re-exported from the modules that hold it.

- :mod:`~rlq.experiments.quarl.runs`: :class:`RunSpec` reads a notebook's ``runs`` entries (algorithm,
  environment, steps, hyperparameters); :func:`train_fp32_agents` trains their fp32 agents.
- :mod:`~rlq.experiments.quarl.ptq` (``quarl_ptq``): :func:`evaluate_ptq` (every precision of every agent,
  cached in the agent's folder so a resumed run does not evaluate again), :func:`ptq_summary`, :func:`ptq_numbers`.
- :mod:`~rlq.experiments.quarl.qat` (``quarl_qat``): :func:`ptq_after_training` (the fp32 agent and its PTQ
  evaluation), :func:`qat_agent` (one QAT agent), :func:`qat_vs_ptq` (both over every run, seed and bit width),
  :func:`qat_summary`, :func:`qat_vs_ptq_table`, :func:`qat_numbers`.
- :mod:`~rlq.experiments.quarl.latency` (``quarl_latency``): :func:`benchmark_networks`, :func:`stored_sizes`,
  :func:`latency_numbers`.
- :mod:`~rlq.experiments.quarl.actorq` (``quarl_actorq``): :func:`train_actorq`, :func:`actorq_summary`,
  :func:`actor_breakdown`, :func:`learner_breakdown`, :func:`breakdown_table`, :func:`speedup`,
  :func:`actorq_numbers`.
- :mod:`~rlq.experiments.quarl.figures`: their Plotly figures (``from rlq.experiments.quarl import figures``;
  not re-exported here, so importing the package does not import Plotly).
"""

from rlq.experiments.quarl.actorq import (
    ACTOR_PARTS,
    LEARNER_PARTS,
    ActorQResults,
    actor_breakdown,
    actor_breakdown_shares,
    actorq_curves,
    actorq_numbers,
    actorq_summary,
    breakdown_table,
    component_shares,
    learner_breakdown,
    paper_breakdown,
    speedup,
    task_name,
    train_actorq,
)
from rlq.experiments.quarl.latency import (
    STORED_PRECISIONS,
    batch1_speedups,
    benchmark_networks,
    latency_claim_lines,
    latency_numbers,
    network_spaces,
    size_table,
    stored_sizes,
)
from rlq.experiments.quarl.ptq import (
    PTQ_CACHE,
    evaluate_ptq,
    ptq_claim_lines,
    ptq_numbers,
    ptq_precisions,
    ptq_summary,
    ptq_table,
)
from rlq.experiments.quarl.qat import (
    ptq_after_training,
    qat_agent,
    qat_numbers,
    qat_summary,
    qat_vs_ptq,
    qat_vs_ptq_table,
)
from rlq.experiments.quarl.runs import (
    CALIBRATION_SEED_OFFSET,
    ON_POLICY,
    AgentRun,
    Progress,
    RunSpec,
    parse_runs,
    train_fp32_agents,
)

__all__ = [
    "ACTOR_PARTS",
    "CALIBRATION_SEED_OFFSET",
    "LEARNER_PARTS",
    "ON_POLICY",
    "PTQ_CACHE",
    "STORED_PRECISIONS",
    "ActorQResults",
    "AgentRun",
    "Progress",
    "RunSpec",
    "actor_breakdown",
    "actor_breakdown_shares",
    "actorq_curves",
    "actorq_numbers",
    "actorq_summary",
    "batch1_speedups",
    "benchmark_networks",
    "breakdown_table",
    "component_shares",
    "evaluate_ptq",
    "latency_claim_lines",
    "latency_numbers",
    "learner_breakdown",
    "network_spaces",
    "paper_breakdown",
    "parse_runs",
    "ptq_after_training",
    "ptq_claim_lines",
    "ptq_numbers",
    "ptq_precisions",
    "ptq_summary",
    "ptq_table",
    "qat_agent",
    "qat_numbers",
    "qat_summary",
    "qat_vs_ptq",
    "qat_vs_ptq_table",
    "size_table",
    "speedup",
    "stored_sizes",
    "task_name",
    "train_actorq",
    "train_fp32_agents",
]
