"""The actors' inference engines: the acting network at fp32, fp16, int8 or simulated n bits, in PyTorch, ONNX Runtime or rlq.deploy.

An engine is loaded with each policy the actor pulls (``load``) and then maps a batch of observations to the
network's outputs (``__call__``). PyTorch engines quantize with :func:`rlq.quant.ptq` (int8: dynamic
quantization with real int8 kernels). ONNX Runtime engines build the graph straight from the broadcast
weights: at int8 one ``com.microsoft.DynamicQuantizeMatMul`` node per layer (int8 weights with a scale
per output channel, activations quantized per batch), so an int8 broadcast is used as it arrives, with no
export or requantization on the actor (except on x86 CPUs without VNNI, where the codes are halved to 7 bits:
see :func:`rlq.core.cpu.int8_needs_reduced_range`). On a 2048x3 MLP at batch 1 with one thread this is the fastest
path measured here (see ``benchmarks/bench_actorq.py``); :func:`choose_backend` decides by measurement.
PyTorch is imported only by the PyTorch engine (and by rlq.deploy's), so an ONNX Runtime actor process never
loads it.

The compiled engine (:class:`CompiledEngine`) runs the policy with :mod:`rlq.deploy`'s kernels in the form it
travelled in: a block-circulant policy's B-vectors in the frequency domain (their DFTs computed at each load,
from 1/B of the dense values), layers whose zeros fill whole blocks (a learner policy pruned in blocks)
block-sparse int8, the other layers dense int8 (or fp32): at each load, what :func:`rlq.deploy.compile_policy`
makes of the learner's broadcast weights. PyTorch and ONNX Runtime engines act with
the dense expansion of the same policy (:meth:`rlq.actorq.broadcast.DecodedPolicy.expanded`).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import numpy as np

from rlq.actorq.architecture import LOG_STD_MAX, LOG_STD_MIN, PolicyArchitecture
from rlq.actorq.broadcast import DecodedPolicy, QuantizedWeight, expand_vectors, quantize_weight
from rlq.core.cpu import int8_needs_reduced_range

log = logging.getLogger(__name__)

ONNX_OPSET = 17


class InferenceEngine(Protocol):
    """Something an actor acts with: ``load`` a pulled policy, then call it on a batch of observations."""

    name: str

    def load(self, policy: DecodedPolicy) -> None: ...

    def __call__(self, obs: np.ndarray) -> list[np.ndarray]: ...


def engine_backends(precision: str) -> tuple[str, ...]:
    """Return the backends ``auto`` measures at ``precision`` (a canonical name).

    torch always; onnx at fp32 and int8; compiled at fp32 and int8 for every policy (dense, block-circulant or
    pruned in blocks) where rlq's compiled policy kernels are built: their NumPy fallback is never the fastest.
    """
    if precision not in ("fp32", "int8"):
        return ("torch",)
    from rlq.deploy import kernels_available
    from rlq.deploy.runtime import USE_KERNELS

    return ("torch", "onnx", "compiled") if USE_KERNELS and kernels_available() else ("torch", "onnx")


class TorchEngine:
    """The acting network in PyTorch: fp32 as is, fp16 cast, int8 dynamically quantized, intN simulated."""

    def __init__(self, arch: PolicyArchitecture, precision: str):
        import torch

        from rlq.actorq.policy import PolicyNet
        from rlq.quant import parse_precision

        self.arch = arch
        self.precision = parse_precision(precision).name
        self.name = f"torch-{self.precision}"
        # The weights are overwritten by load(): draw nothing from the caller's random stream.
        with torch.random.fork_rng():
            self.net = PolicyNet(arch).eval()
        self.model = None

    def load(self, policy: DecodedPolicy) -> None:
        """Load ``policy``'s weights, then quantize the network to the engine's precision.

        An int8 policy that arrives as int8 codes goes straight into the int8 layers built at the first
        load (only the weights are repacked), and fp16/bf16 weights are copied into the low-precision
        network built at the first load: about 10x faster than dequantizing, copying and quantizing
        the network again, which made loads dominate int8 actors that pull every 30 steps.
        """
        from rlq.quant import parse_precision, ptq
        from rlq.quant.ptq import CastPrecision

        policy = policy.expanded()  # B-vectors as their dense expansion (codes stay codes)
        spec = parse_precision(self.precision)
        already = not spec.is_float and all(
            isinstance(w, QuantizedWeight) and w.bits == spec.bits
            for k, w in policy.weights.items()
            if k.endswith(".weight")
        )
        if spec.name == "int8" and already and self.model is not None and self._load_int8_codes(policy):
            return
        if spec.is_float and spec.name != "fp32" and isinstance(self.model, CastPrecision):
            # fp16 / bf16: copy the new weights into the low-precision copy built at the first load (a cast
            # on copy), instead of deep-copying and casting the whole network at every pull
            self.model.module.load_arrays(policy.float_weights())
            return
        self.net.load_arrays(policy.float_weights())
        if spec.name == "fp32" or (already and spec.bits != 8):
            self.model = self.net  # n-bit weights that arrived per channel are already what intN acts with
        else:
            self.model = ptq(self.net, spec.name, per_channel_linear=True)
            if spec.name == "int8" and already:
                self._load_int8_codes(policy)  # act with the codes sent, not a re-quantization of them

    def _load_int8_codes(self, policy: DecodedPolicy) -> bool:
        """Return True after setting ``policy``'s int8 codes and scales into the int8 model's layers.

        False (nothing changed) when the model's layers and the policy's weights do not match one to one.
        """
        import torch
        from torch.ao.nn.quantized import dynamic as qdynamic

        weights = policy.weights
        layers = {
            name: m
            for name, m in self.model.named_modules()
            if isinstance(m, (qdynamic.Linear, torch.nn.Linear))
        }
        if {f"{n}.{p}" for n in layers for p in ("weight", "bias")} != set(weights):
            return False
        for name, layer in layers.items():
            weight, bias = weights[f"{name}.weight"], np.asarray(weights[f"{name}.bias"], dtype=np.float32)
            if isinstance(layer, qdynamic.Linear):
                if not isinstance(weight, QuantizedWeight):
                    return False
                codes = torch.from_numpy(np.ascontiguousarray(weight.codes, dtype=np.int8))
                scales = torch.from_numpy(np.asarray(weight.scale, dtype=np.float64))
                zeros = torch.zeros(len(scales), dtype=torch.long)
                qweight = torch._make_per_channel_quantized_tensor(codes, scales, zeros, 0)
                layer.set_weight_bias(qweight, torch.from_numpy(bias.copy()))
            else:
                dense = weight.dequantize() if isinstance(weight, QuantizedWeight) else weight
                with torch.no_grad():
                    layer.weight.copy_(torch.from_numpy(np.asarray(dense, dtype=np.float32)))
                    layer.bias.copy_(torch.from_numpy(bias))
        return True

    def __call__(self, obs: np.ndarray) -> list[np.ndarray]:
        import torch

        if self.model is None:
            raise RuntimeError("no policy loaded yet")
        with torch.inference_mode():
            out = self.model(torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32)))
        if isinstance(out, tuple):
            return [o.numpy() for o in out]
        return [out.numpy()]


class OnnxEngine:
    """The acting network as an ONNX Runtime session built from the broadcast weights (fp32 or int8)."""

    def __init__(self, arch: PolicyArchitecture, precision: str, threads: int = 1):
        if precision not in ("fp32", "int8"):
            raise ValueError(f"ONNX Runtime actors act at fp32 or int8, not {precision}")
        self.arch, self.precision, self.threads = arch, precision, threads
        self.name = f"onnx-{precision}"
        self.session = None

    def _linear(
        self, nodes: list, inits: list, name: str, x: str, weight, bias: np.ndarray, out: str
    ) -> None:
        from onnx import helper, numpy_helper

        tag = name.replace(".weight", "").replace(".", "_")
        b = numpy_helper.from_array(np.ascontiguousarray(bias, dtype=np.float32), f"{tag}_b")
        if self.precision == "int8":
            q = weight if isinstance(weight, QuantizedWeight) and weight.bits == 8 else None
            if q is None:
                dense = weight.dequantize() if isinstance(weight, QuantizedWeight) else weight
                q = quantize_weight(dense, 8, name=name)
            codes, scale = q.codes, q.scale
            if int8_needs_reduced_range():  # x86 without VNNI saturates full-range int8: use 7-bit codes
                codes = np.clip(np.rint(codes.astype(np.float32) / 2), -64, 63).astype(np.int8)
                scale = scale * 2
            inits += [
                numpy_helper.from_array(np.ascontiguousarray(codes.T), f"{tag}_wq"),
                numpy_helper.from_array(np.ascontiguousarray(scale, dtype=np.float32), f"{tag}_ws"),
                numpy_helper.from_array(np.zeros(q.scale.shape, dtype=np.int8), f"{tag}_wz"),
                b,
            ]
            nodes.append(
                helper.make_node(
                    "DynamicQuantizeMatMul",
                    [x, f"{tag}_wq", f"{tag}_ws", f"{tag}_wz", f"{tag}_b"],
                    [out],
                    domain="com.microsoft",
                )
            )
        else:
            dense = weight.dequantize() if isinstance(weight, QuantizedWeight) else weight
            inits += [numpy_helper.from_array(np.ascontiguousarray(dense.T, dtype=np.float32), f"{tag}_w"), b]
            nodes.append(helper.make_node("MatMul", [x, f"{tag}_w"], [f"{tag}_mm"]))
            nodes.append(helper.make_node("Add", [f"{tag}_mm", f"{tag}_b"], [out]))

    def model_bytes(self, policy: DecodedPolicy) -> bytes:
        """Return the serialized ONNX model of ``policy`` at the engine's precision."""
        from onnx import TensorProto, helper, numpy_helper

        arch, w = self.arch, policy.expanded().weights
        nodes: list = []
        inits: list = []
        x = "obs"
        act = {"relu": "Relu", "tanh": "Tanh"}[arch.activation]
        for i in range(len(arch.hidden_sizes)):
            self._linear(
                nodes, inits, f"layers.{i}.weight", x, w[f"layers.{i}.weight"], w[f"layers.{i}.bias"], f"h{i}"
            )
            nodes.append(helper.make_node(act, [f"h{i}"], [f"a{i}"]))
            x = f"a{i}"
        if arch.stochastic:
            self._linear(nodes, inits, "mu.weight", x, w["mu.weight"], w["mu.bias"], "mean")
            self._linear(
                nodes, inits, "log_std.weight", x, w["log_std.weight"], w["log_std.bias"], "log_std_raw"
            )
            inits += [
                numpy_helper.from_array(np.array(LOG_STD_MIN, dtype=np.float32), "log_std_min"),
                numpy_helper.from_array(np.array(LOG_STD_MAX, dtype=np.float32), "log_std_max"),
            ]
            nodes.append(helper.make_node("Clip", ["log_std_raw", "log_std_min", "log_std_max"], ["log_std"]))
            outputs = ["mean", "log_std"]
        else:
            self._linear(nodes, inits, "mu.weight", x, w["mu.weight"], w["mu.bias"], "mu")
            nodes.append(helper.make_node("Tanh", ["mu"], ["action"]))
            outputs = ["action"]
        graph = helper.make_graph(
            nodes,
            "actorq_policy",
            [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", arch.obs_dim])],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["batch", arch.act_dim]) for o in outputs],
            inits,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid("com.microsoft", 1)],
        )
        model.ir_version = 8
        return model.SerializeToString()

    def load(self, policy: DecodedPolicy) -> None:
        """Build the ONNX graph of ``policy`` and open an ONNX Runtime session on it (``threads`` threads)."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        self.session = ort.InferenceSession(
            self.model_bytes(policy), options, providers=["CPUExecutionProvider"]
        )
        self._outputs = [o.name for o in self.session.get_outputs()]

    def __call__(self, obs: np.ndarray) -> list[np.ndarray]:
        if self.session is None:
            raise RuntimeError("no policy loaded yet")
        return self.session.run(self._outputs, {"obs": np.ascontiguousarray(obs, dtype=np.float32)})


class CompiledEngine:
    """The acting network as an :class:`rlq.deploy.CompiledPolicy` built from the broadcast (fp32 or int8).

    Block-circulant layers (B-vectors) run in the frequency domain at the engine's precision (int8 DFTs at int8:
    B-vectors that arrived as codes are dequantized, transformed and quantized again as DFTs, each load); at int8,
    layers whose zeros fill whole blocks run block-sparse (the block shape chosen as
    :func:`rlq.deploy.compile_policy` chooses it), other layers dense int8 or fp32 (dense int8 codes that arrived
    are requantized by the same per-row rule, which gives them back). B outside :data:`rlq.deploy.frequency.KERNEL_BLOCK_SIZES` runs as the dense expansion.
    Op names follow :func:`rlq.actorq.policy.acting_sequential`, so ``rlq.deploy.error_bound`` compares the two.
    Without rlq's compiled kernels the same ops run in NumPy (:attr:`compiled` is then False), as
    :func:`rlq.deploy.compile_policy` does.
    """

    def __init__(self, arch: PolicyArchitecture, precision: str):
        from rlq.deploy import kernels_available
        from rlq.deploy.runtime import USE_KERNELS

        if precision not in ("fp32", "int8"):
            raise ValueError(f"compiled actors act at fp32 or int8, not {precision}")
        self.arch, self.precision = arch, precision
        self.name = f"compiled-{precision}"
        self.compiled = bool(USE_KERNELS and kernels_available())
        if not self.compiled:
            log.warning(
                "rlq's compiled policy kernels are %s: compiled actors run their ops in NumPy, far slower",
                "switched off (RLQ_DEPLOY_KERNELS=0)" if kernels_available() else "not built",
            )
        self.policy = None

    def layer_specs(self, policy: DecodedPolicy) -> list:
        """Return the :class:`rlq.deploy.reader.LinearSpec` rows of ``policy``: hidden layers, then one head."""
        from rlq.deploy.frequency import KERNEL_BLOCK_SIZES
        from rlq.deploy.reader import LinearSpec

        def value(name: str) -> np.ndarray:
            w = policy.weights[name]
            return w.dequantize() if isinstance(w, QuantizedWeight) else np.asarray(w, dtype=np.float32)

        def int8_codes(names: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
            """The int8 codes and row scales of dense weights that arrived as such, stacked by rows; else None."""
            weights = [policy.weights[n] for n in names]
            if not all(
                isinstance(w, QuantizedWeight) and w.bits == 8 and not w.is_circulant for w in weights
            ):
                return None
            return np.concatenate([w.codes for w in weights]), np.concatenate([w.scale for w in weights])

        arch, specs = self.arch, []
        for i in range(len(arch.hidden_sizes)):
            weight, bias = value(f"layers.{i}.weight"), value(f"layers.{i}.bias")
            vectors, codes = None, int8_codes([f"layers.{i}.weight"])
            if weight.ndim == 3:
                vectors = np.ascontiguousarray(weight)
                weight = None if weight.shape[2] in KERNEL_BLOCK_SIZES else expand_vectors(vectors)
            specs.append(
                LinearSpec(str(2 * i), weight, bias, vectors=vectors, activation=arch.activation, int8=codes)
            )
        heads = [f"{h}.weight" for h in (["mu", "log_std"] if arch.stochastic else ["mu"])]
        weight = np.concatenate([value(h) for h in heads])
        bias = np.concatenate([value(h.replace(".weight", ".bias")) for h in heads])
        name = str(2 * len(arch.hidden_sizes))
        activation = "none" if arch.stochastic else "tanh"
        specs.append(LinearSpec(name, weight, bias, activation=activation, int8=int8_codes(heads)))
        return specs

    def load(self, policy: DecodedPolicy) -> None:
        """Compile ``policy`` (its layers packed for the kernels: DFTs of the B-vectors, int8 codes)."""
        from rlq.deploy.formats import MAX_SPARSE_DENSITY
        from rlq.deploy.reader import OutputSpec
        from rlq.deploy.runtime import CompiledPolicy, plan_layer, vector_blocks

        p, vector = self.precision, vector_blocks(self.compiled)
        ops = [plan_layer(spec, p, p, None, MAX_SPARSE_DENSITY, vector) for spec in self.layer_specs(policy)]
        self.policy = CompiledPolicy(ops, OutputSpec(), self.arch.obs_dim, self.compiled)

    def __call__(self, obs: np.ndarray) -> list[np.ndarray]:
        if self.policy is None:
            raise RuntimeError("no policy loaded yet")
        out = self.policy.outputs(np.ascontiguousarray(obs, dtype=np.float32))
        if not self.arch.stochastic:
            return [out]
        act = self.arch.act_dim
        return [out[:, :act], np.clip(out[:, act:], LOG_STD_MIN, LOG_STD_MAX)]


def engine_label(backend: str, precision: str) -> str:
    """Return the name an ActorQ result gives its actors' engine, e.g. ``onnx-int8``; ``compiled-numpy-int8`` where
    compiled actors run without rlq's kernels."""
    if backend == "compiled":
        from rlq.deploy import kernels_available
        from rlq.deploy.runtime import USE_KERNELS

        if not (USE_KERNELS and kernels_available()):
            return f"compiled-numpy-{precision}"
    return f"{backend}-{precision}"


def make_engine(
    arch: PolicyArchitecture, precision: str, backend: str
) -> TorchEngine | OnnxEngine | CompiledEngine:
    """Return an unloaded engine for ``precision`` on ``backend`` (``torch``, ``onnx`` or ``compiled``)."""
    if backend == "torch":
        return TorchEngine(arch, precision)
    if backend == "onnx":
        return OnnxEngine(arch, precision)
    if backend == "compiled":
        return CompiledEngine(arch, precision)
    raise ValueError(f"unknown actor backend {backend!r}; choose torch, onnx or compiled")


def random_policy(arch: PolicyArchitecture, seed: int = 0) -> DecodedPolicy:
    """Return a freshly initialised fp32 policy of ``arch`` (its block-circulant layers as projected B-vectors).

    PyTorch's random stream is left as it was, so that measuring does not move a run's.
    """
    import torch

    from rlq.actorq.policy import PolicyNet
    from rlq.compress import circulant_projection

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = PolicyNet(arch)
    weights = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    for name in arch.circulant_weights():
        weights[name] = circulant_projection(torch.from_numpy(weights[name]), arch.block_size).numpy()
    return DecodedPolicy(0, "fp32", weights)


def measure_engines(
    arch: PolicyArchitecture,
    precision: str,
    backends: tuple[str, ...] | None = None,
    policy: DecodedPolicy | None = None,
    repeats: int = 200,
) -> dict[str, dict[str, float]]:
    """Return ``{backend: {median_us, p90_us, load_s}}`` of the acting network on each backend, batch 1, one thread.

    ``policy`` defaults to :func:`random_policy`. ``backends`` defaults to those ``auto`` measures
    (:func:`engine_backends`). Latency is :func:`rlq.quant.measure_latency`; ``load_s`` is the median time of a
    ``load`` of the policy (after a first, untimed one).
    """
    from rlq.quant import measure_latency
    from rlq.quant.latency import torch_threads

    if policy is None:
        policy = random_policy(arch)
    obs = np.random.default_rng(0).standard_normal((1, arch.obs_dim)).astype(np.float32)
    results = {}
    with torch_threads(1):
        for backend in backends or engine_backends(precision):
            engine = make_engine(arch, precision, backend)
            engine.load(policy)  # the first load pays one-off initialisation (ONNX Runtime's, torch's)
            loads = []
            for _ in range(3):
                start = time.perf_counter()
                engine.load(policy)
                loads.append(time.perf_counter() - start)
            load_s = float(np.median(loads))
            results[backend] = {**measure_latency(engine, obs, repeats=repeats, warmup=20), "load_s": load_s}
    return results


def choose_backend(
    arch: PolicyArchitecture, precision: str, steps_per_load: int = 30
) -> tuple[str, dict[str, dict[str, float]]]:
    """Return the backend with the lowest measured cost per actor step at ``precision``, and all measurements.

    The cost of a step is its batch-1 latency plus one policy load spread over ``steps_per_load`` steps
    (an actor loads at most once per update period), so an engine that is fast to run but slow to load
    does not win when policies change every few steps.
    """
    timings = measure_engines(arch, precision)
    for t in timings.values():
        t["cost_per_step_us"] = t["median_us"] + 1e6 * t["load_s"] / max(1, steps_per_load)
    return min(timings, key=lambda b: timings[b]["cost_per_step_us"]), timings
