"""A trained SB3 agent's actor deployed as a compression method ships: a packed file, an ONNX Runtime session, measured.

The methods (:data:`METHODS`) of ``combo_sparse_quant``: dense fp32, PTQ int8 (of a dense, pruned or GST agent),
GST in fp32, and QAT at ``qat_bits`` bits (of a GST or pruned agent). Deployment (:func:`deploy_actor`) is the same
path for every method, so that methods compare like with like:

1. **Stored file.** The actor's action path is written with :func:`rlq.quant.size.save_packed` at the
   method's width (:func:`deployment`): fp32 values for dense and GST; 8-bit codes with one scale per tensor
   for PTQ int8 (QuaRL's rule for linear layers, and ``torch.ao``'s dynamic default); ``qat_bits``-bit codes
   with one scale per output channel (per block row of a block-circulant layer) for QAT, QAT's own grid, so
   packing changes no value. Sparse layers store their kept values and the cheaper of a bitmask and relative
   indices. ``bits_per_weight`` is :func:`rlq.quant.bits_per_weight` of that format (biases excluded) and
   ``packed_bytes`` the file's size on disk (plus a small JSON header and the float32 biases).
2. **Runtime.** The packed file is loaded into a plain dense actor of the same architecture (block-circulant
   weights expanded, codes dequantized) and exported to ONNX: int8 (ONNX Runtime's dynamic quantization,
   which re-quantizes the decoded weights per tensor onto its own int8 grid) for the 8-bit methods, fp32 for
   the others (n-bit QAT values dequantized at load; a sparse weight runs as a dense matmul with zeros,
   NOTES.md: CSR kernels lose below ~90% sparsity). The method is **evaluated through this runtime**, so its
   return is the return of what was stored and shipped, not of the training-time module.
3. **Latency.** Batch-1 latency of every method's ONNX file and of a dense fp32 actor of the same
   architecture (the reference, exported from a fresh network), timed in interleaved rounds in one process
   (:func:`deployed_latency`); ``latency_ratio`` is the method's median over the reference's. Timings move
   with machine load (NOTES.md: a loaded 2-core machine inflated one ratio 6x): these numbers mean something
   only on a quiet machine; report ``uptime`` beside them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

METHODS = ("dense", "ptq_int8", "pruning_ptq_int8", "gst", "gst_ptq_int8", "gst_qat", "pruning_qat")
"""The methods compared, in table order."""

INT8_METHODS = ("ptq_int8", "pruning_ptq_int8", "gst_ptq_int8")
QAT_METHODS = ("gst_qat", "pruning_qat")
REFERENCE = "dense_fp32_reference"
"""The latency reference: a dense fp32 actor of the same architecture, in ONNX Runtime."""


def method_label(method: str, qat_bits: int = 4) -> str:
    """Return the method's name in tables and figures, e.g. ``"GST + QAT 4-bit"``."""
    labels = {
        "dense": "dense fp32",
        "ptq_int8": "PTQ int8",
        "pruning_ptq_int8": "gradual pruning + PTQ int8",
        "gst": "GST (fp32)",
        "gst_ptq_int8": "GST + PTQ int8",
        "gst_qat": f"GST + QAT {qat_bits}-bit",
        "pruning_qat": f"gradual pruning + QAT {qat_bits}-bit",
    }
    if method not in labels:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return labels[method]


def check_methods(methods: Sequence[str]) -> list[str]:
    """Return ``methods`` in :data:`METHODS` order, or raise ValueError naming an unknown or repeated one."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods repeat a name: {list(methods)}")
    if not methods:
        raise ValueError("methods is empty")
    return [m for m in METHODS if m in methods]


def deployment(method: str, qat_bits: int = 4) -> tuple[int | None, bool | None, str]:
    """Return ``(stored bits or None for fp32, per-channel scales?, ONNX precision)`` of ``method`` as deployed."""
    if method in INT8_METHODS:
        return 8, False, "int8"
    if method in QAT_METHODS:
        return qat_bits, True, "fp32"
    if method in ("dense", "gst"):
        return None, None, "fp32"
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def plain_action_network(model: Any) -> Any:
    """Return a fresh, uncompressed copy of ``model``'s action path (same architecture, new weights), in eval mode."""
    from rlq.sb3.action_path import action_network

    fresh = model.policy_class(
        model.observation_space, model.action_space, lambda _: 0.0, **model.policy_kwargs
    )
    network, _ = action_network(fresh)
    return network.eval()


@dataclass
class DeployedActor:
    """One method's actor as shipped: its stored size, its ONNX Runtime session and an SB3-style policy."""

    method: str
    bits_per_weight: float
    packed_bytes: int
    onnx_path: Path
    session: Any
    """The :class:`rlq.quant.OnnxPolicy` (timed by :func:`measure_side_by_side`)."""
    policy: Any
    """A :class:`rlq.sb3.quantized.QuantizedPolicy` around the ONNX Runtime session, with SB3's ``predict``."""


def example_observation(model: Any, seed: int = 0) -> Any:
    """Return one preprocessed observation (a batch of 1) from ``model``'s observation space, seeded."""
    from rlq.sb3.action_path import preprocess_observations

    space = model.observation_space
    space.seed(seed)
    return preprocess_observations(model, space.sample()[None])


def deploy_actor(model: Any, method: str, folder: str | Path, qat_bits: int = 4) -> DeployedActor:
    """Return ``model``'s actor deployed as ``method`` (see the module docstring): packed file, then ONNX session.

    Files ``<method>.rlqp`` and ``<method>.onnx`` are written into ``folder`` (replaced if present: they are
    derived from the trained model, which the run folder keeps).
    """
    from rlq.quant import OnnxPolicy, bits_per_weight, export_onnx
    from rlq.quant.size import load_packed, save_packed
    from rlq.sb3.action_path import PolicyInterface, action_network
    from rlq.sb3.quantized import QuantizedPolicy

    bits, per_channel, precision = deployment(method, qat_bits)
    folder = Path(folder)
    network, kind = action_network(model)
    stored_bits = bits_per_weight(network, bits, per_channel)
    packed = save_packed(network, folder / f"{method}.rlqp", bits, per_channel)
    plain = plain_action_network(model)
    result = plain.load_state_dict(load_packed(packed), strict=False)
    weights = [k for k in result.missing_keys if k.endswith(("weight", "bias"))]
    if weights or result.unexpected_keys:
        raise RuntimeError(f"the packed actor does not fit its architecture: missing {weights}, "
                           f"unexpected {result.unexpected_keys}")  # fmt: skip
    path = export_onnx(
        plain, folder / f"{method}.onnx", example_observation(model), precision, overwrite=True
    )
    session = OnnxPolicy(path, threads=1)
    wrapped = QuantizedPolicy(
        session,
        PolicyInterface.of(model, kind),
        precision=precision if bits is None or bits == 8 else f"int{bits}",
        backend="onnx",
        size_bytes=packed.stat().st_size,
    )
    return DeployedActor(method, float(stored_bits), packed.stat().st_size, path, session, wrapped)


def reference_session(model: Any, folder: str | Path) -> Any:
    """Return an ONNX Runtime session of a dense fp32 actor with ``model``'s architecture (the latency reference)."""
    from rlq.quant import OnnxPolicy, export_onnx

    path = export_onnx(
        plain_action_network(model), Path(folder) / f"{REFERENCE}.onnx", example_observation(model), "fp32",
        overwrite=True,
    )  # fmt: skip
    return OnnxPolicy(path, threads=1)


def measure_side_by_side(
    sessions: dict[str, Callable[[np.ndarray], Any]],
    x: np.ndarray,
    *,
    repeats: int = 200,
    rounds: int = 5,
    warmup: int = 20,
) -> dict[str, dict[str, float]]:
    """Return ``{name: {"median_us", "p90_us"}}`` of each callable on ``x``, timed in interleaved rounds.

    Each round times every callable one after the other with :func:`rlq.quant.latency.measure_latency`
    (``warmup`` untimed calls, then ``repeats`` timed ones), for ``rounds`` rounds, so that drift in machine
    load falls on all of them alike; the result is the median over rounds of each round's median and 90th
    percentile. Only meaningful on a quiet machine: report ``uptime`` with the numbers.
    """
    from rlq.core.validation import check_positive_int
    from rlq.quant.latency import measure_latency

    check_positive_int("rounds", rounds)
    x = np.ascontiguousarray(x, dtype=np.float32)
    per_round: dict[str, list[dict[str, float]]] = {name: [] for name in sessions}
    for _ in range(rounds):
        for name, fn in sessions.items():
            per_round[name].append(measure_latency(fn, x, repeats=repeats, warmup=warmup))
    return {
        name: {key: float(np.median([r[key] for r in rounds_of])) for key in ("median_us", "p90_us")}
        for name, rounds_of in per_round.items()
    }


def deploy_and_measure(
    model: Any,
    env_id: str,
    methods: Sequence[str],
    *,
    seed: int,
    folder: str | Path,
    qat_bits: int = 4,
    eval_episodes: int = 5,
) -> list[dict[str, Any]]:
    """Return one row per method: ``method``, deployed ``eval_return`` and ``eval_std``, ``bits_per_weight``, ``packed_bytes``.

    Each method is deployed into ``folder`` (:func:`deploy_actor`) and evaluated through its runtime on
    ``eval_episodes`` episodes seeded ``seed + EVAL_SEED_OFFSET``. The folder also gets the dense fp32
    reference and one seeded observation, so that :func:`deployed_latency` can time the methods later.
    """
    from rlq.rl.evaluate import EVAL_SEED_OFFSET, evaluate

    deployed = {m: deploy_actor(model, m, folder, qat_bits) for m in check_methods(methods)}
    reference_session(model, folder)
    np.save(Path(folder) / LATENCY_INPUT, example_observation(model, seed).numpy())
    rows = []
    for method, actor in deployed.items():
        result = evaluate(actor.policy, env_id, n_episodes=eval_episodes, seed=seed + EVAL_SEED_OFFSET)
        rows.append(dict(method=method, eval_return=result.mean, eval_std=result.std,
                         bits_per_weight=actor.bits_per_weight, packed_bytes=actor.packed_bytes))  # fmt: skip
    return rows


LATENCY_INPUT = "latency_input.npy"
"""The batch-1 observation a deployed folder's ONNX Runtime sessions are timed on (written by :func:`deploy_and_measure`)."""


def latency_columns(timings: dict[str, dict[str, float]], method: str) -> dict[str, float]:
    """Return ``method``'s latency columns from :func:`measure_side_by_side`'s ``timings`` (NaN where not timed)."""
    nan = float("nan")
    timing = timings.get(method, {})
    reference = timings.get(REFERENCE, {}).get("median_us", nan)
    latency = timing.get("median_us", nan)
    return dict(latency_us=latency, latency_p90_us=timing.get("p90_us", nan), reference_latency_us=reference,
                latency_ratio=nan if math.isnan(reference) else latency / reference)  # fmt: skip


def deployed_latency(
    folder: str | Path, methods: Sequence[str], *, repeats: int = 200, rounds: int = 5
) -> dict[str, dict[str, float]]:
    """Return :func:`measure_side_by_side`'s timings of the ONNX files ``deploy_and_measure`` left in ``folder``.

    Times ``<method>.onnx`` of each of ``methods`` beside the dense fp32 reference on the stored observation,
    so latency can be measured after all training has finished, on a quiet machine, instead of beside
    another worker's training. Raises FileNotFoundError naming a missing file.
    """
    from rlq.quant import OnnxPolicy

    folder = Path(folder)
    names = [REFERENCE, *check_methods(methods)]
    missing = [n for n in [*(f"{n}.onnx" for n in names), LATENCY_INPUT] if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {missing}: deploy the agent first (deploy_and_measure)")
    sessions = {name: OnnxPolicy(folder / f"{name}.onnx", threads=1) for name in names}
    return measure_side_by_side(sessions, np.load(folder / LATENCY_INPUT), repeats=repeats, rounds=rounds)
