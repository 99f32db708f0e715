"""ActorQ: distributed actor-learner training whose actors act with quantized policies.

QuaRL (Krishnan et al., TMLR 2022, arXiv 1910.01055), section 5: a learner trains in fp32; a broadcaster
quantizes the policy (fp16, int8 or fewer bits) and publishes it; actors pull it every ``update_period``
steps, act with quantized inference and send their transitions to the learner's replay buffer.

- :class:`ActorQConfig`: every knob, validated before anything starts.
- :func:`train` -> :class:`ActorQResult`: learning curve against wall-clock, time breakdown per component,
  bytes per broadcast; ``backend="local"`` (one process) or ``"ray"`` (Ray actors, restarted when they die).
- :func:`ray_session`: one Ray instance for several ``train`` calls.
- :class:`D4PG`: the paper's learner (distributional critic, n-step returns) as a Stable-Baselines3 algorithm.
- :func:`encode_policy` / :func:`decode_policy`: the broadcast wire format at any precision.
- :func:`predict_speedup` / :func:`speedup_curve`: the end-to-end speedup of quantized actors predicted from measured
  costs, and which side (actors or learner) binds.
- :func:`measure_engines` / :func:`choose_backend`: actor inference engines (PyTorch, ONNX Runtime, rlq.deploy's
  compiled kernels for dense, block-circulant and block-pruned policies: :class:`CompiledEngine`) measured.
- ``policy_block_size``: a block-circulant policy trained in fp32 (:func:`block_circulant_policy_`) whose
  broadcast carries its B-vectors, 1/B of the dense values; compiled actors run them in the frequency domain.

Builds on ``rlq.quant`` (quantization, latency), ``rlq.compress`` (block-circulant layers), ``rlq.rl.agents`` (SB3
models), ``rlq.rl.envs``, ``rlq.sb3.checkpoint`` (compressed checkpoints) and ``rlq.deploy`` (compiled actors);
nothing below imports it. Names load on first use: an actor process imports neither SB3 nor, with ONNX Runtime, PyTorch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Names are loaded on first use, so that an actor process (which imports rlq.actorq.actor) pulls in
# neither Stable-Baselines3 nor, with ONNX Runtime inference, PyTorch.
_HOMES = {
    "DecodedPolicy": "broadcast",
    "QuantizedWeight": "broadcast",
    "decode_policy": "broadcast",
    "encode_policy": "broadcast",
    "expand_vectors": "broadcast",
    "D4PG": "d4pg",
    "categorical_projection": "d4pg",
    "ActorQConfig": "config",
    "ActorQConfigError": "config",
    "learner_device": "config",
    "CompiledEngine": "inference",
    "OnnxEngine": "inference",
    "TorchEngine": "inference",
    "choose_backend": "inference",
    "engine_agreement": "evaluator",
    "make_engine": "inference",
    "measure_engines": "inference",
    "random_policy": "inference",
    "PolicyArchitecture": "architecture",
    "PolicyNet": "policy",
    "acting_sequential": "policy",
    "block_circulant_policy_": "policy",
    "architecture_of": "policy",
    "policy_weights": "policy",
    "BREAKDOWN_KEYS": "result",
    "ActorQResult": "result",
    "TrainingProgress": "result",
    "time_to_return": "result",
    "time_to_learned_return": "result",
    "SpeedupPrediction": "cost_model",
    "StepCosts": "cost_model",
    "Topology": "cost_model",
    "predict_speedup": "cost_model",
    "speedup_curve": "cost_model",
    "step_costs": "cost_model",
    "ray_session": "actor_runtimes",
    "train": "driver",
}

if TYPE_CHECKING:
    from rlq.actorq.actor_runtimes import ray_session
    from rlq.actorq.architecture import PolicyArchitecture
    from rlq.actorq.broadcast import (
        DecodedPolicy,
        QuantizedWeight,
        decode_policy,
        encode_policy,
        expand_vectors,
    )
    from rlq.actorq.config import ActorQConfig, ActorQConfigError, learner_device
    from rlq.actorq.cost_model import (
        SpeedupPrediction,
        StepCosts,
        Topology,
        predict_speedup,
        speedup_curve,
        step_costs,
    )
    from rlq.actorq.d4pg import D4PG, categorical_projection
    from rlq.actorq.driver import train
    from rlq.actorq.evaluator import engine_agreement
    from rlq.actorq.inference import (
        CompiledEngine,
        OnnxEngine,
        TorchEngine,
        choose_backend,
        make_engine,
        measure_engines,
        random_policy,
    )
    from rlq.actorq.policy import (
        PolicyNet,
        acting_sequential,
        architecture_of,
        block_circulant_policy_,
        policy_weights,
    )
    from rlq.actorq.result import (
        BREAKDOWN_KEYS,
        ActorQResult,
        TrainingProgress,
        time_to_learned_return,
        time_to_return,
    )


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rlq.actorq' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rlq.actorq.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "BREAKDOWN_KEYS",
    "ActorQConfig",
    "ActorQConfigError",
    "ActorQResult",
    "CompiledEngine",
    "D4PG",
    "DecodedPolicy",
    "OnnxEngine",
    "PolicyArchitecture",
    "PolicyNet",
    "QuantizedWeight",
    "TorchEngine",
    "TrainingProgress",
    "acting_sequential",
    "architecture_of",
    "block_circulant_policy_",
    "categorical_projection",
    "choose_backend",
    "decode_policy",
    "encode_policy",
    "engine_agreement",
    "expand_vectors",
    "learner_device",
    "make_engine",
    "measure_engines",
    "policy_weights",
    "SpeedupPrediction",
    "StepCosts",
    "Topology",
    "predict_speedup",
    "random_policy",
    "ray_session",
    "speedup_curve",
    "step_costs",
    "time_to_learned_return",
    "time_to_return",
    "train",
]
