"""Stable-Baselines3 adapters: put rlq's compression and quantization into any SB3 training.

Submodules are imported on demand: ``rlq.sb3.networks`` (which layers an SB3 policy holds),
``rlq.sb3.gst`` (GST and gradual-pruning callbacks), ``rlq.sb3.qat`` (quantization-aware training).
"""
