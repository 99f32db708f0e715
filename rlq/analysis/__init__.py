"""rlq.analysis: the tables and figures that the notebooks and ``rlq report`` draw from a run's results.

- ``gst``: GST's tables (method means, interval estimates over seeds, phase returns, sweep tables), the
  classification comparison, and their Plotly figures (``gst.compression_figures``).
- ``quarl``: QuaRL's PTQ and QAT tables, ActorQ's breakdowns, regimes and convergence, and their figures
  (``quarl.quantization_figures``).
- ``pareto`` and ``pareto_figures``: the Pareto tables and figure of ``combo_sparse_quant``.
- ``shared_figures``: the Plotly template and the figures several notebooks share.

Everything here reads tables; nothing trains. A figure that one notebook alone draws is written in that
notebook's cell.
"""
