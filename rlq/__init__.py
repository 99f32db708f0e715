"""rlq: cheaper deep RL through compressed (GST) and quantized (QuaRL, ActorQ) networks.

The package holds the implementations and the few helpers that the experiment notebooks in
``notebooks/`` share; the notebooks narrate and plot. Submodules are imported on demand so
that ``import rlq`` stays cheap.
"""

from rlq.runs import record

__version__ = "0.1.0"
__all__ = ["record", "__version__"]
