"""rlq.core: the helpers beneath every other part of rlq (argument validation, JSON I/O, parametrizations, block maps).

It imports nothing from the rest of rlq, so every layer may use it.
"""
