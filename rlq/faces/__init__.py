"""rlq.faces: what a person uses on top of rlq: the ``rlq`` command, the report and the notebook widgets.

Nothing else in rlq imports these modules.
"""
