"""perturb_weights(): the matched noise control, uniform noise of at most half a quantization step per weight."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from rlq.quant import perturb_weights, ptq, quantization_step


def tiny_cnn(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(72, 4)
    )


def step_of(weight: torch.Tensor, bits: int, per_channel: bool) -> torch.Tensor:
    """The step computed here, independently: max|w| / (2^(bits-1) - 1), per tensor or per output row."""
    w = weight.detach().double()
    top = w.flatten(1).abs().amax(dim=1) if per_channel else w.abs().max().expand(w.shape[0])
    return (top / (2 ** (bits - 1) - 1)).reshape(-1, *[1] * (w.dim() - 1))


@pytest.mark.parametrize("bits", [4, 8, 12])
@pytest.mark.parametrize("per_channel_linear", [False, True])
def test_noise_is_bounded_by_half_a_step(bits, per_channel_linear):
    model = tiny_cnn()
    before = copy.deepcopy(model.state_dict())
    noisy = perturb_weights(model, bits, seed=3, per_channel_linear=per_channel_linear)
    assert noisy is not model and not noisy.training
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the original is untouched
    for i, per_channel in ((0, True), (2, True), (5, per_channel_linear)):
        weight = model[i].weight.detach().double()
        noise = noisy[i].weight.detach().double() - weight
        half = step_of(weight, bits, per_channel) / 2
        rounding = torch.finfo(torch.float32).eps * weight.abs()  # w + noise is rounded to float32
        assert (noise.abs() <= half + rounding).all()
        assert noise.abs().amax() > 0.8 * half.min()  # noise of that size, not less
        assert torch.equal(noisy[i].bias, model[i].bias)
        step = quantization_step(model[i], bits, per_channel_linear).double().expand_as(noise)
        torch.testing.assert_close(step, (2 * half).expand_as(noise), rtol=1e-6, atol=0)


def test_per_tensor_and_per_channel_steps_differ_for_linear_layers():
    linear = nn.Linear(64, 8)
    with torch.no_grad():
        linear.weight[0] *= 10  # one row much wider than the others
    per_tensor = perturb_weights(nn.Sequential(linear), 8, seed=0)[0].weight - linear.weight
    per_row = (
        perturb_weights(nn.Sequential(linear), 8, seed=0, per_channel_linear=True)[0].weight - linear.weight
    )
    small = step_of(linear.weight, 8, per_channel=True)[1:] / 2
    assert (per_row[1:].abs() <= small * (1 + 1e-5)).all()
    assert (per_tensor[1:].abs() > small).any()


def test_seeds():
    model = tiny_cnn()
    a, b = perturb_weights(model, 8, seed=0), perturb_weights(model, 8, seed=0)
    c = perturb_weights(model, 8, seed=1)
    for i in (0, 2, 5):
        assert torch.equal(a[i].weight, b[i].weight)
        assert not torch.equal(a[i].weight, c[i].weight)
        assert (a[i].weight != c[i].weight).float().mean() > 0.99


def test_mean_absolute_noise_is_a_quarter_step_and_centred():
    torch.manual_seed(0)
    big = nn.Sequential(nn.Linear(512, 512))
    bits = 8
    noise = (perturb_weights(big, bits, seed=7)[0].weight - big[0].weight).detach().double()
    step = float(step_of(big[0].weight, bits, per_channel=False).max())
    # Uniform on [-Δ/2, Δ/2]: E|n| = Δ/4 and sd(|n|) = Δ/(4 sqrt 3); over 262144 draws the mean is within ~0.1%.
    assert float(noise.abs().mean()) == pytest.approx(step / 4, rel=0.01)
    assert abs(float(noise.mean())) < 0.002 * step
    assert float(noise.abs().max()) == pytest.approx(step / 2, rel=0.001)


def test_noise_matches_the_step_of_ptq():
    """Quantization error and the noise share their bound: the step ptq's int4 rounds to."""
    model = tiny_cnn()
    error = (ptq(model, "int4")[5].weight - model[5].weight).detach().abs()
    noise = (perturb_weights(model, 4, seed=0)[5].weight - model[5].weight).detach().abs()
    bound = float(quantization_step(model[5], 4)) / 2
    assert float(error.max()) <= bound * (1 + 1e-5) and float(noise.max()) <= bound * (1 + 1e-5)


def test_all_zero_channels_stay_exact():
    layer = nn.Conv2d(2, 3, 3)
    with torch.no_grad():
        layer.weight[1] = 0
    noisy = perturb_weights(nn.Sequential(layer), 6, seed=0)[0]
    assert not noisy.weight[1].any() and noisy.weight[0].ne(layer.weight[0]).any()


def test_bad_inputs():
    with pytest.raises(TypeError, match="seed must be an int"):
        perturb_weights(tiny_cnn(), 8, seed=1.5)
    with pytest.raises(ValueError, match="bits must be in"):
        perturb_weights(tiny_cnn(), 1, seed=0)
    with pytest.raises(ValueError, match="no Linear or convolution layer"):
        perturb_weights(nn.Sequential(nn.ReLU()), 8, seed=0)
    model = tiny_cnn()
    with torch.no_grad():
        model[2].weight.view(-1)[3] = float("nan")
    with pytest.raises(ValueError, match="the weight of layer '2'"):
        perturb_weights(model, 8, seed=0)
