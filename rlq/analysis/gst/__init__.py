"""GST experiments (Group-Sparse Training): what the GST notebooks call, re-exported from the modules that hold it.

In the order the notebooks call it:

The notebooks build their callbacks (with :mod:`rlq.sb3.gst_settings`' rule) and train them in a cell of their own.

- :mod:`~rlq.analysis.gst.tables`: :func:`method_means`, :func:`compare_methods`, :func:`seed_estimates` (IQM intervals over seeds), :func:`phase_returns` (score per phase of training), :func:`controller_decisions`,
  :func:`gst_start_compression`, :func:`sweep_label`, :func:`sweep_table` and :func:`sweep_numbers` turn the
  tables into what the notebooks show and record.
- :mod:`~rlq.analysis.gst.classification`: :func:`load_classification_data`, :func:`classification_tables`, :func:`mean_over_seeds`,
  :func:`classification_estimates` and :func:`classification_numbers`, the ResNet-32 comparison of
  ``gst_classification``.
- :mod:`~rlq.analysis.gst.compression_figures`: their Plotly figures
  (``from rlq.analysis.gst import compression_figures``; not re-exported here, so importing the package
  does not import Plotly).
"""

from rlq.analysis.gst.classification import (
    classification_estimates,
    classification_numbers,
    classification_tables,
    load_classification_data,
    mean_over_seeds,
)
from rlq.analysis.gst.tables import (
    compare_methods,
    controller_decisions,
    gst_start_compression,
    method_means,
    phase_returns,
    score_column,
    seed_estimates,
    sweep_label,
    sweep_numbers,
    sweep_table,
    transition_shifts,
)

__all__ = [
    "classification_estimates",
    "classification_numbers",
    "classification_tables",
    "compare_methods",
    "controller_decisions",
    "gst_start_compression",
    "load_classification_data",
    "mean_over_seeds",
    "method_means",
    "phase_returns",
    "score_column",
    "seed_estimates",
    "sweep_label",
    "sweep_numbers",
    "sweep_table",
    "transition_shifts",
]
