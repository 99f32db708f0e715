"""ptq(): quantized copies at every precision; the original is never touched; int8 is really integer."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.ao.nn.quantized import dynamic as qdynamic

from rlq.quant import CastPrecision, LayerHolder, Precision, parse_precision, ptq, quantize_tensor
from rlq.quant.activations import ActivationQuantizer
from rlq.quant.ptq import QuantizePerBatch, output_linear_names


def tiny_mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


def tiny_cnn(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 8, 3, stride=2),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 3 * 3, 4),
    )


class NeedsEagerMode(nn.Module):
    """A CNN that torch.fx cannot trace (Python control flow on a tensor's shape)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.head = nn.Linear(4 * 9 * 9, 2)

    def forward(self, x):
        if x.dim() == 3:
            x = x.unsqueeze(0)
        return self.head(self.flatten(self.relu(self.conv(x))))


X = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
IMAGES = torch.rand(8, 2, 11, 11, generator=torch.Generator().manual_seed(2))


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "int8", "int4", "int2", "int16"])
def test_original_is_left_unchanged(precision):
    model = tiny_mlp().train()
    before, out_before = snapshot(model), model(X).detach()
    quantized = ptq(model, precision, calibration=X, activations=precision == "int4")
    quantized(X)
    assert quantized is not model and model.training and not quantized.training
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(isinstance(m, ActivationQuantizer) for m in model.modules())
    assert not model._forward_pre_hooks and not model[0]._forward_pre_hooks
    assert torch.equal(model(X), out_before)


def test_cnn_original_is_left_unchanged_by_static_int8():
    model = tiny_cnn()
    before = snapshot(model)
    ptq(model, "int8", calibration=IMAGES)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(type(m) in (nn.Sequential, nn.Conv2d, nn.ReLU, nn.Flatten, nn.Linear) for m in model.modules())


def test_fp32_is_an_equal_copy():
    model = tiny_mlp()
    copy_ = ptq(model, "fp32")
    assert torch.equal(copy_(X), model(X))
    assert all(
        p.data_ptr() != q.data_ptr() for p, q in zip(copy_.parameters(), model.parameters(), strict=True)
    )


@pytest.mark.parametrize(
    ("precision", "dtype", "tol"), [("fp16", torch.float16, 5e-3), ("bf16", torch.bfloat16, 5e-2)]
)
def test_half_precisions_take_and_return_float32(precision, dtype, tol):
    model = tiny_mlp()
    half = ptq(model, precision)
    assert isinstance(half, CastPrecision)
    assert all(p.dtype == dtype for p in half.parameters())
    out = half(X)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, model(X), atol=tol, rtol=tol)
    cnn = tiny_cnn()
    torch.testing.assert_close(ptq(cnn, precision)(IMAGES), cnn(IMAGES), atol=tol, rtol=tol)


def test_cast_precision_handles_nested_outputs():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 2), nn.Linear(6, 1)

        def forward(self, x, mask):
            return {"a": self.a(x), "pair": (self.b(x), mask)}

    out = ptq(TwoHeads(), "fp16")(X, torch.ones(16, dtype=torch.bool))
    assert out["a"].dtype == torch.float32 and out["pair"][0].dtype == torch.float32
    assert out["pair"][1].dtype == torch.bool


def test_int8_mlp_uses_dynamic_integer_kernels():
    model = tiny_mlp()
    quantized = ptq(model, "int8")
    layers = [m for m in quantized.modules() if isinstance(m, qdynamic.Linear)]
    assert len(layers) == 3
    assert all(layer.weight().dtype == torch.qint8 for layer in layers)
    assert not any(type(m) is nn.Linear for m in quantized.modules())
    torch.testing.assert_close(quantized(X), model(X), atol=0.05, rtol=0.05)


def test_int8_bare_linear_is_wrapped_and_quantized():
    layer = nn.Linear(6, 4)
    quantized = ptq(layer, "int8")
    assert isinstance(quantized, LayerHolder) and isinstance(quantized.layer, qdynamic.Linear)
    assert quantized.layer.weight().dtype == torch.qint8
    torch.testing.assert_close(quantized(X), layer(X), atol=0.05, rtol=0.05)


def quantized_modules(model: nn.Module) -> list[nn.Module]:
    return [
        m
        for m in model.modules()
        if type(m).__module__.startswith("torch.ao.nn.") and "quantized" in type(m).__module__
    ]


def test_int8_cnn_uses_static_integer_kernels():
    model = tiny_cnn()
    quantized = ptq(model, "int8", calibration=[IMAGES[:4], IMAGES[4:].double().numpy()])
    kinds = [type(m).__name__ for m in quantized_modules(quantized)]
    assert "ConvReLU2d" in kinds and "Linear" in kinds  # conv + ReLU fused, all integer
    convs = [m for m in quantized.modules() if type(m).__name__ == "ConvReLU2d"]
    assert all(conv.weight().dtype == torch.qint8 for conv in convs)
    torch.testing.assert_close(quantized(IMAGES), model(IMAGES), atol=0.02, rtol=0.1)


def test_int8_static_falls_back_to_eager_mode_for_untraceable_models():
    model = NeedsEagerMode().eval()
    images = IMAGES
    quantized = ptq(model, "int8", calibration=images)
    kinds = {type(m).__name__ for m in quantized_modules(quantized)}
    assert {"Conv2d", "Linear", "DeQuantize"} <= kinds
    assert isinstance(quantized.quant, QuantizePerBatch)  # the input is quantized over each batch's range
    torch.testing.assert_close(quantized(images), model(images), atol=0.02, rtol=0.1)


def test_int8_mlp_with_activations_is_static():
    model = tiny_mlp()
    quantized = ptq(model, "int8", calibration=X, activations=True)
    layers = dict(quantized.named_modules())
    assert type(layers["0"]).__name__ == "LinearReLU" and not isinstance(layers["0"], qdynamic.Linear)
    assert type(layers["2"]).__module__.startswith(
        "torch.ao.nn.quantized.modules"
    )  # static, calibrated output
    assert isinstance(layers["4"], qdynamic.Linear)  # the output layer: int8 weights, float output
    torch.testing.assert_close(quantized(X), model(X), atol=0.05, rtol=0.1)


def test_static_int8_keeps_small_output_gaps():
    """A solved DQN's Q-values lie near 100 and differ by ~0.05; an int8 output (step 0.78 over [0, 100]) merged
    them and the agent fell (static int8 51 vs dynamic 500 on CartPole). The output layer keeps float outputs."""
    torch.manual_seed(0)
    q_net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    with torch.no_grad():
        q_net[4].bias.fill_(100.0)
        reference = q_net(X)
        q = ptq(q_net, "int8", calibration=X, activations=True)(X)
    gaps = (reference[:, 0] - reference[:, 1]).abs()
    assert float(gaps.median()) < 0.05 and q.unique().numel() == q.numel()
    torch.testing.assert_close(q, reference, atol=0.01, rtol=0)
    assert torch.equal(q.argmax(1), reference.argmax(1))


def test_output_linear_names():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.act, self.pi, self.v = (
                nn.Linear(6, 8),
                nn.ReLU(),
                nn.Linear(8, 2),
                nn.Linear(8, 1),
            )
            self.squash = nn.Tanh()

        def forward(self, x):
            h = self.act(self.body(x))
            return self.squash(self.pi(h)), self.v(h).flatten()

    assert sorted(output_linear_names(TwoHeads())) == ["pi", "v"]
    assert output_linear_names(tiny_mlp()) == ["4"] and output_linear_names(tiny_cnn()) == ["5"]
    assert output_linear_names(nn.Sequential(nn.Conv2d(2, 2, 3), nn.ReLU())) == []


def test_int8_static_needs_calibration():
    with pytest.raises(ValueError, match="needs calibration data"):
        ptq(tiny_cnn(), "int8")
    with pytest.raises(ValueError, match="needs calibration data"):
        ptq(tiny_mlp(), "int8", activations=True)


@pytest.mark.parametrize("bits", [2, 4, 6, 8 + 2])
def test_simulated_int_weights(bits):
    model = tiny_cnn()
    quantized = ptq(model, f"int{bits}")
    conv, linear = quantized[0], quantized[5]
    # Convolutions per output channel, linear layers per tensor (QuaRL's choice); biases stay float.
    assert max(channel.unique().numel() for channel in conv.weight) <= 2**bits
    assert linear.weight.unique().numel() <= 2**bits
    assert torch.equal(conv.weight, quantize_tensor(model[0].weight, bits, per_channel_axis=0))
    assert torch.equal(linear.weight, quantize_tensor(model[5].weight, bits))
    assert torch.equal(conv.bias, model[0].bias)
    assert not any(isinstance(m, ActivationQuantizer) for m in quantized.modules())


def test_simulated_per_channel_linear():
    model = tiny_mlp()
    quantized = ptq(model, "int3", per_channel_linear=True)
    assert torch.equal(quantized[2].weight, quantize_tensor(model[2].weight, 3, per_channel_axis=0))
    assert quantized[2].weight.unique().numel() > 2**3  # per row, not per tensor


def capture_inputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    seen = []
    handles = [
        m.register_forward_hook(lambda mod, args, out: seen.append(args[0].detach()))
        for m in model.modules()
        if isinstance(m, nn.Linear)
    ]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return seen


def test_simulated_activations_dynamic_range():
    quantized = ptq(tiny_mlp(), "int3", activations=True)
    inputs = capture_inputs(quantized, X)
    assert len(inputs) == 3
    assert all(t.unique().numel() <= 2**3 for t in inputs)
    assert all(q.dynamic for q in quantized.modules() if isinstance(q, ActivationQuantizer))


def test_simulated_activations_calibrated_range():
    model = tiny_mlp()
    quantized = ptq(model, "int4", calibration=[X[:8], X[8:]], activations=True)
    first = quantized[0].input_quantizer
    assert not first.observing and first.enabled
    assert float(first.min_val) == pytest.approx(float(X.min())) and float(first.max_val) == pytest.approx(
        float(X.max())
    )
    wide = X * 3  # outside the calibrated range: clipped to it
    inputs = capture_inputs(quantized, wide)
    assert all(t.unique().numel() <= 2**4 for t in inputs)
    assert float(inputs[0].max()) <= float(X.max()) + 1e-6


def test_ptq_of_a_parametrized_model_quantizes_the_parametrized_weight():
    from torch.nn.utils import parametrize

    class Double(nn.Module):
        def forward(self, w):
            return 2 * w

    model = tiny_mlp()
    reference = copy.deepcopy(model)
    parametrize.register_parametrization(model[0], "weight", Double())
    quantized = ptq(model, "int8")
    assert isinstance(quantized[0], qdynamic.Linear)
    torch.testing.assert_close(quantized[0].weight().dequantize(), 2 * reference[0].weight, atol=0.02, rtol=0)
    assert parametrize.is_parametrized(model[0], "weight")  # the original keeps its parametrization


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown precision 'int1'; choose one of fp32, fp16, bf16"):
        ptq(tiny_mlp(), "int1")
    with pytest.raises(ValueError, match="unknown precision"):
        ptq(tiny_mlp(), "fp8")
    with pytest.raises(TypeError, match="nn.Module"):
        ptq(lambda x: x, "int8")
    with pytest.raises(ValueError, match="no Linear or convolution layer"):
        ptq(nn.Sequential(nn.ReLU()), "int4")
    with pytest.raises(TypeError, match="calibration batches"):
        ptq(tiny_cnn(), "int8", calibration=["not a tensor"])
    with pytest.raises(ValueError, match="no batch"):
        ptq(tiny_cnn(), "int8", calibration=[])


def with_bad_weight(model: nn.Module, layer: int, value: float) -> nn.Module:
    with torch.no_grad():
        model[layer].weight.view(-1)[7] = value  # row 0, column 7 of a Linear weight
    return model


@pytest.mark.parametrize("precision", ["int8", "int4", "int16"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_weights_are_refused_naming_the_layer(precision, bad):
    """int4 used to zero every other weight of the layer, int8 to fail inside torch (min > max)."""
    model = with_bad_weight(tiny_mlp(), 2, bad)
    counts = "1 NaN and 0 inf" if bad != bad else "0 NaN and 1 inf"
    with pytest.raises(
        ValueError, match=f"the weight of layer '2' to {precision}: it holds {counts} among its 1024"
    ):
        ptq(model, precision)
    with pytest.raises(ValueError, match="the weight of layer '0' to int8"):
        ptq(with_bad_weight(tiny_cnn(), 0, bad), "int8", calibration=IMAGES)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_casts_carry_a_nan_where_it_was(precision):
    """A cast maps each value on its own: the NaN stays one NaN and destroys nothing else, so it passes."""
    model = with_bad_weight(tiny_mlp(), 2, float("nan"))
    cast = ptq(model, precision).module
    weight = cast[2].weight.float()
    assert weight.isnan().sum() == 1 and weight[0, 7].isnan()
    finite = ~model[2].weight.isnan()
    torch.testing.assert_close(weight[finite], model[2].weight[finite].detach(), atol=1e-2, rtol=1e-2)


PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_symmetric)
PER_TENSOR = (torch.per_tensor_affine, torch.per_tensor_symmetric)


def int8_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The torch.ao integer Linear / convolution layers of ``model`` (dynamic, static, fused), by name."""
    return {
        name: m
        for name, m in model.named_modules()
        if callable(getattr(m, "weight", None)) and type(m).__module__.startswith("torch.ao.nn.")
    }


def torch_int8_codes(
    weight: torch.Tensor, per_channel: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch's symmetric qint8 weights, computed here: codes in [-128, 127], scale max|w| / 127.5.

    Also returns where ``w / scale`` lies half-way between two codes (the largest magnitude does, at 127.5),
    where float32 and float64 arithmetic may round to different neighbours.
    """
    rows = weight.detach().double().flatten(1)
    top = rows.abs().amax(dim=1) if per_channel else rows.abs().max().reshape(1)
    scale = top / ((127 - -128) / 2)
    exact = rows / scale.unsqueeze(1)
    codes = torch.clamp(torch.round(exact), -128, 127)
    ties = ((exact - exact.floor()) - 0.5).abs() < 1e-4
    return codes.reshape(weight.shape), scale, ties.reshape(weight.shape)


def assert_int8_weight(qweight: torch.Tensor, weight: torch.Tensor, per_channel: bool) -> None:
    codes, scale, ties = torch_int8_codes(weight, per_channel)
    if per_channel:
        assert qweight.qscheme() in PER_CHANNEL
        assert qweight.q_per_channel_axis() == 0
        torch.testing.assert_close(qweight.q_per_channel_scales().double(), scale, rtol=1e-6, atol=0)
        assert not qweight.q_per_channel_zero_points().any()
    else:
        assert qweight.qscheme() in PER_TENSOR
        assert qweight.q_scale() == pytest.approx(float(scale), rel=1e-6) and qweight.q_zero_point() == 0
    difference = (qweight.int_repr().double() - codes).abs()
    assert not difference[~ties].any() and difference.max() <= 1


@pytest.mark.parametrize("per_channel", [False, True])
def test_int8_dynamic_honours_per_channel_linear(per_channel):
    """ptq(..., "int8", per_channel_linear=True) used to give per-tensor layers (quantize_dynamic's default)."""
    model = tiny_mlp()
    quantized = ptq(model, "int8", per_channel_linear=per_channel)
    layers = int8_layers(quantized)
    assert sorted(layers) == ["0", "2", "4"] and all(isinstance(m, qdynamic.Linear) for m in layers.values())
    for name, layer in layers.items():
        assert_int8_weight(layer.weight(), model[int(name)].weight, per_channel)
    torch.testing.assert_close(quantized(X), model(X), atol=0.05, rtol=0.05)
    bare = ptq(nn.Linear(6, 4), "int8", per_channel_linear=per_channel).layer
    assert bare.weight().qscheme() in (PER_CHANNEL if per_channel else PER_TENSOR)


@pytest.mark.parametrize("per_channel", [False, True])
def test_int8_static_honours_per_channel_linear(per_channel):
    """x86's default static qconfig made every layer per channel: now linear layers follow the flag, convs stay per channel."""
    cnn = tiny_cnn()
    quantized = ptq(cnn, "int8", calibration=IMAGES, per_channel_linear=per_channel)
    layers = int8_layers(quantized)
    assert sorted(layers) == ["0", "2", "5"]
    assert_int8_weight(layers["0"].weight(), cnn[0].weight, per_channel=True)
    assert_int8_weight(layers["2"].weight(), cnn[2].weight, per_channel=True)
    assert_int8_weight(layers["5"].weight(), cnn[5].weight, per_channel)

    mlp = tiny_mlp()
    quantized = ptq(mlp, "int8", calibration=X, activations=True, per_channel_linear=per_channel)
    layers = int8_layers(quantized)
    assert {type(m).__name__ for m in layers.values()} == {"LinearReLU", "Linear"}
    for name, layer in layers.items():
        assert_int8_weight(layer.weight(), mlp[int(name)].weight, per_channel)
    torch.testing.assert_close(quantized(X), mlp(X), atol=0.05, rtol=0.1)
    bare = ptq(nn.Linear(6, 4), "int8", calibration=X, activations=True, per_channel_linear=per_channel)
    (layer,) = int8_layers(bare).values()  # a bare layer is held as a child, so it can be swapped
    assert layer.weight().qscheme() in (PER_CHANNEL if per_channel else PER_TENSOR)


@pytest.mark.parametrize("per_channel", [False, True])
def test_int8_eager_fallback_honours_per_channel_linear(per_channel):
    model = NeedsEagerMode().eval()
    quantized = ptq(model, "int8", calibration=IMAGES, per_channel_linear=per_channel)
    layers = int8_layers(quantized)
    assert_int8_weight(layers["module.conv"].weight(), model.conv.weight, per_channel=True)
    assert_int8_weight(layers["module.head"].weight(), model.head.weight, per_channel)


def test_precision_names_the_simulated_8_bit_point():
    assert parse_precision("sim8") == Precision("sim8", 8, False) and parse_precision(" SIM8 ").name == "sim8"
    assert [parse_precision(p).simulated for p in ("sim8", "int8", "int4", "int16", "fp32", "fp16")] == [
        True,
        False,
        True,
        True,
        False,
        False,
    ]
    with pytest.raises(ValueError, match="int2 ... int16, sim8"):
        parse_precision("sim4")


@pytest.mark.parametrize("per_channel", [False, True])
def test_sim8_is_weights_only_quantize_tensor_at_8_bits(per_channel):
    """sim8 is made like every other simulated width: weights fake-quantized, biases and activations float."""
    model = tiny_cnn()
    quantized = ptq(model, "sim8", per_channel_linear=per_channel)
    assert [type(m) for m in quantized.modules()] == [type(m) for m in model.modules()]  # no int8 kernels
    assert not any(isinstance(m, ActivationQuantizer) for m in quantized.modules())
    for i in (0, 2, 5):
        axis = 0 if i < 5 or per_channel else None
        assert torch.equal(quantized[i].weight, quantize_tensor(model[i].weight, 8, per_channel_axis=axis))
        assert torch.equal(quantized[i].bias, model[i].bias)
    with torch.no_grad():  # activations float: the same float network with the quantized weights
        float_copy = copy.deepcopy(model)
        for i in (0, 2, 5):
            float_copy[i].weight.copy_(quantized[i].weight)
        assert torch.equal(quantized(IMAGES), float_copy(IMAGES))
    assert not torch.equal(quantized[5].weight, model[5].weight)


def first_layer_inputs(quantized: nn.Module, name: str, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    """The quantized tensors that the int8 layer ``name`` of ``quantized`` receives for ``batches``."""
    seen = []
    handle = dict(quantized.named_modules())[name].register_forward_pre_hook(
        lambda m, args: seen.append(args[0])
    )
    with torch.no_grad():
        for batch in batches:
            quantized(batch)
    handle.remove()
    return seen


@pytest.mark.parametrize(
    ("model", "first", "calibration"),
    [(tiny_mlp, "0", X), (tiny_cnn, "0", IMAGES), (NeedsEagerMode, "module.conv", IMAGES)],
    ids=["mlp", "cnn", "eager"],
)
def test_static_int8_quantizes_the_model_input_over_each_batch_range(model, first, calibration):
    """A policy meets observations beyond its calibration rollout's: clipping them to the calibrated range
    broke a solved CartPole agent (static int8 444 vs 500 over 50 episodes), so the input's range is the batch's."""
    net = model().eval()
    quantized = ptq(net, "int8", calibration=calibration, activations=True)
    wide, narrow = calibration * 8 - 2, calibration[:1] * 0.01
    for batch, seen in zip([wide, narrow], first_layer_inputs(quantized, first, [wide, narrow]), strict=True):
        assert seen.is_quantized and seen.dtype == torch.quint8
        low, high = float(batch.min().clamp(max=0)), float(batch.max().clamp(min=0))
        levels = 127 if torch.backends.quantized.engine in ("x86", "fbgemm") else 255  # reduce_range there
        assert seen.q_scale() == pytest.approx((high - low) / levels, rel=1e-5)
        torch.testing.assert_close(seen.dequantize(), batch, atol=seen.q_scale() / 2 + 1e-6, rtol=0)


def test_simulated_ptq_of_a_pruned_model_quantizes_what_runs_and_keeps_the_zeros():
    """torch.nn.utils.prune's hook would recompute the float weight at the next forward; ptq bakes it first."""
    from torch.nn.utils import prune

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    model(torch.randn(2, 16)).sum().backward()  # a forward with grad: the weight is no graph leaf
    quantized = ptq(model, "int4")
    quantized(torch.randn(3, 16))  # a forward must not bring the float weights back
    weight = quantized[0].weight.detach()
    expected = quantize_tensor(model[0].weight.detach(), 4)  # the masked weight, quantized per tensor
    assert torch.equal(weight, expected)
    assert len(torch.unique(weight)) <= 2**4
    assert bool((weight[model[0].weight_mask == 0] == 0).all())
    assert hasattr(model[0], "weight_orig")  # the original keeps its mask
