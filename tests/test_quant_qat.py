"""QAT: fake quantization really runs, gradients pass the STE, conversion leaves at most 2^bits levels."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from rlq.quant import WeightFakeQuant, convert_qat_, is_qat, prepare_qat_, quantize_tensor, set_qat_enabled
from rlq.quant.activations import ActivationQuantizer


def tiny_mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))


def tiny_cnn(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))


X = torch.randn(64, 3, generator=torch.Generator().manual_seed(1))
Y = (X[:, :1] * 2 - X[:, 1:2] + 0.5 * X[:, 2:3] ** 2).detach()


def linear_weights(model: nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear)]


@pytest.mark.parametrize("activations", [False, True])
def test_training_through_the_ste_reduces_the_loss(activations):
    model = tiny_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # built before prepare: must keep working
    prepare_qat_(model, bits=4, activations=activations)
    losses = []
    for _ in range(60):
        loss = nn.functional.mse_loss(model(X), Y)
        optimizer.zero_grad()
        loss.backward()
        originals = [m.parametrizations.weight.original for m in model if isinstance(m, nn.Linear)]
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in originals)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_prepare_keeps_the_parameter_objects():
    model = tiny_mlp()
    before = [m.weight for m in model if isinstance(m, nn.Linear)]
    prepare_qat_(model, bits=8)
    after = [m.parametrizations.weight.original for m in model if isinstance(m, nn.Linear)]
    assert all(a is b for a, b in zip(before, after, strict=True))


def test_fake_quantization_really_changes_the_forward():
    # QuaRL's public QAT path inserted no fake quantization (its issue #15): here 2 bits must show.
    model = tiny_mlp()
    reference = copy.deepcopy(model)
    prepare_qat_(model, bits=2)
    assert is_qat(model)
    assert not torch.allclose(model(X), reference(X), atol=1e-3)
    assert all(w.unique().numel() <= 3 * 16 for w in linear_weights(model))  # 3 levels per row


@pytest.mark.parametrize("activations", [False, True])
def test_disabled_qat_equals_the_float_forward_exactly(activations):
    model = tiny_mlp()
    reference = copy.deepcopy(model)
    prepare_qat_(model, bits=2, activations=activations)
    assert set_qat_enabled(model, False) == (6 if activations else 3)
    assert torch.equal(model(X), reference(X))
    set_qat_enabled(model, True)
    assert not torch.equal(model(X), reference(X))


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("bits", [2, 3, 5])
def test_conversion_bakes_at_most_2_to_the_bits_levels(bits, per_channel):
    model = tiny_mlp()
    prepare_qat_(model, bits=bits, per_channel=per_channel)
    set_qat_enabled(model, False)  # conversion quantizes even when QAT was still off
    expected = [
        quantize_tensor(w, bits, per_channel_axis=0 if per_channel else None) for w in linear_weights(model)
    ]
    float_weights = [m.parametrizations.weight.original for m in model if isinstance(m, nn.Linear)]
    returned = convert_qat_(model)
    assert returned is model and not is_qat(model)
    assert not any(parametrize.is_parametrized(m) for m in model.modules())
    for weight, want, original in zip(linear_weights(model), expected, float_weights, strict=True):
        assert isinstance(weight, nn.Parameter) and weight is original
        assert torch.equal(weight, want)
        if per_channel:
            assert max(row.unique().numel() for row in weight) <= 2**bits
        else:
            assert weight.unique().numel() <= 2**bits


def test_conversion_of_a_cnn_is_per_output_channel():
    model = tiny_cnn()
    prepare_qat_(model, bits=3)
    out = model(torch.rand(2, 1, 8, 8))
    convert_qat_(model)
    conv = model[0].weight
    assert max(channel.unique().numel() for channel in conv) <= 8
    assert conv.unique().numel() > 8  # each channel has its own scale
    torch.testing.assert_close(model(torch.rand(2, 1, 8, 8)).shape, out.shape)


def test_converted_forward_equals_the_enabled_qat_forward():
    model = tiny_mlp()
    prepare_qat_(model, bits=4, activations=True)
    model(X)  # observe activation ranges
    model.eval()
    for q in model.modules():
        if isinstance(q, ActivationQuantizer):
            q.observing = False
    before = model(X)
    convert_qat_(model)
    torch.testing.assert_close(model(X), before, atol=1e-6, rtol=0)


def test_activation_ranges_follow_a_moving_average():
    model = tiny_mlp()
    prepare_qat_(model, bits=8, activations=True)
    first = model[0].input_quantizer
    model(X)
    assert float(first.min_val) == pytest.approx(float(X.min()))
    model(X * 2)
    expected = float(X.max()) + 0.01 * (float(2 * X.max()) - float(X.max()))
    assert float(first.max_val) == pytest.approx(expected)
    convert_qat_(model)
    frozen = float(first.max_val)
    model(X * 10)
    assert float(first.max_val) == frozen and not first.observing


def test_other_parametrizations_run_before_the_quantizer():
    class Half(nn.Module):
        def forward(self, w):
            return w / 2

    model = tiny_mlp()
    raw = model[0].weight.detach().clone()
    parametrize.register_parametrization(model[0], "weight", Half())
    prepare_qat_(model, bits=4)
    chain = model[0].parametrizations.weight
    assert isinstance(chain[0], Half) and isinstance(chain[1], WeightFakeQuant)
    assert torch.equal(model[0].weight.detach(), quantize_tensor(raw / 2, 4, per_channel_axis=0))


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"bits must be in \[2, 16\]"):
        prepare_qat_(tiny_mlp(), bits=1)
    with pytest.raises(ValueError, match="no Linear or convolution layer"):
        prepare_qat_(nn.Sequential(nn.ReLU()), bits=4)
    model = prepare_qat_(tiny_mlp(), bits=4)
    with pytest.raises(ValueError, match="already prepared"):
        prepare_qat_(model, bits=4)
    with pytest.raises(ValueError, match="call prepare_qat_ first"):
        set_qat_enabled(tiny_mlp(), True)
    with pytest.raises(ValueError, match="call prepare_qat_ first"):
        convert_qat_(tiny_mlp())
    assert not is_qat(tiny_mlp())


def test_a_nan_weight_during_qat_stops_training_naming_the_layer():
    """A NaN made the whole channel's fake-quantized weight NaN; training went on with NaN losses."""
    model = prepare_qat_(tiny_mlp(), bits=4)
    model(X)
    with torch.no_grad():
        model[2].parametrizations.weight.original[3, 5] = float("nan")
    with pytest.raises(
        ValueError, match="the weight of layer '2' in QAT: it holds 1 NaN and 0 inf among its 256"
    ):
        model(X)
    set_qat_enabled(model, False)  # before the quantization delay ends the float weights pass as they are
    assert model(X).isnan().any()
    with pytest.raises(ValueError, match="layer '2'"):
        convert_qat_(model)
