"""rlq: cheaper deep RL through compressed (GST) and quantized (QuaRL, ActorQ) networks.

The package holds the implementations and the few helpers that the experiment notebooks in
``notebooks/`` share; the notebooks narrate and plot. Submodules are imported on demand so
that ``import rlq`` stays cheap.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["record", "__version__"]


def record(**numbers: Any) -> dict[str, Any]:
    """Return the numbers recorded into this run folder's ``results.json`` (see :func:`rlq.experiments.runs.record`)."""
    from rlq.experiments.runs import record as record_in_run_folder

    return record_in_run_folder(**numbers)
