"""Training with rlq's compiled kernels gives the same weights, bit for bit, as with the PyTorch ops they replace."""

from __future__ import annotations

import pytest
import torch

from rlq.compress import circulant
from rlq.quant import tensor as quant_tensor
from rlq.quant.latency import torch_threads
from rlq.rl.agents import make_model
from rlq.sb3.gst_callback import GSTCallback
from rlq.sb3.qat_callback import QATCallback


def train(monkeypatch, use_kernels: bool, with_qat: bool) -> dict[str, torch.Tensor]:
    """Return the policy's state after 300 TD3 steps on Pendulum with GST at B = 4 (and 4-bit QAT from step 150)."""
    monkeypatch.setattr(circulant, "USE_KERNELS", use_kernels)
    monkeypatch.setattr(quant_tensor, "USE_KERNELS", use_kernels)
    model = make_model(
        "TD3",
        "Pendulum-v1",
        seed=3,
        hyperparams={"learning_starts": 100, "policy_kwargs": {"net_arch": [64, 64]}},
    )
    gst = GSTCallback(total_steps=10**9, block_schedule=((0.0, 4),), bc_end=1.0, log_every=10**9)
    callbacks = [QATCallback(4, delay_steps=150), gst] if with_qat else [gst]
    with torch_threads(1):  # a 64-wide network: more threads only wait on each other, badly under load
        model.learn(300, callback=callbacks)
    return {k: v.clone() for k, v in model.policy.state_dict().items()}


@pytest.mark.parametrize("with_qat", [False, True], ids=["gst", "gst+qat"])
def test_training_is_bit_for_bit_the_same_with_and_without_kernels(monkeypatch, with_qat):
    with_kernels, without = train(monkeypatch, True, with_qat), train(monkeypatch, False, with_qat)
    assert with_kernels.keys() == without.keys()
    for key in with_kernels:
        assert torch.equal(with_kernels[key], without[key]), key
    vectors = [v for k, v in with_kernels.items() if k.endswith("original") and v.dim() == 3]
    assert vectors  # the hidden layers trained as B-vectors
    if with_qat:  # converted at the end: at most 15 levels per block row
        assert all(row.unique().numel() <= 15 for v in vectors for row in v)
