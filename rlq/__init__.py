"""rlq: cheaper deep RL through compressed (GST) and quantized (QuaRL, ActorQ) networks.

The package holds the implementations and the few helpers that the experiment notebooks in
``notebooks/`` share; the notebooks narrate and plot. Submodules are imported on demand so
that ``import rlq`` stays cheap.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["claims", "record", "stats", "__version__"]

_LAZY_MODULES = {"stats": "rlq.stats", "claims": "rlq.claims"}
"""``rlq.stats`` (interval estimates over seeds) and ``rlq.claims`` (each claim's rule), imported on first use
as attributes of ``rlq``; ``import rlq.stats`` works as for any module."""


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        import importlib

        return importlib.import_module(_LAZY_MODULES[name])
    raise AttributeError(f"module 'rlq' has no attribute {name!r}")


def record(**numbers: Any) -> dict[str, Any]:
    """Return the numbers recorded into this run folder's ``results.json`` (see :func:`rlq.experiments.run_folders.record`).

    A notebook shows them at 3 significant figures; the file and the returned values keep every digit.
    """
    from rlq.experiments.run_folders import record as record_in_run_folder

    return record_in_run_folder(**numbers)
