"""Stable-Baselines3 adapters: put rlq's compression and quantization into any SB3 training.

Submodules are imported on demand:

- ``rlq.sb3.networks``: the anatomy of an SB3 policy: its layers per network, which the callbacks compress,
  their target twins, and the optimizers training them.
- ``rlq.sb3.compression``: ``CompressionCallback``, what every compression callback shares (and the dense
  baseline's recorder).
- ``rlq.sb3.gst``: ``GSTCallback``; ``rlq.sb3.pruning``: ``GradualPruningCallback`` (the iterative-pruning baseline).
- ``rlq.sb3.checkpoint``: saving and loading compressed models, schedule state included.
- ``rlq.sb3.qat``: ``QATCallback``, quantization-aware training that provably quantizes.
- ``rlq.sb3.quantized``: any SB3 model evaluated at any precision (fp16, int8, simulated int2..int16).
- ``rlq.sb3.action_path``: the network from observation to action of any SB3 policy, and its observation
  preprocessing (what ``quantized`` quantizes and exports).
"""
