"""measure_latency, measure_interleaved, compare_backends and fastest_backend on tiny models."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn

from rlq.quant import BACKENDS, compare_backends, fastest_backend, measure_interleaved, measure_latency


def test_measure_latency_times_each_call():
    calls = []

    def slow(x):
        calls.append(x)
        time.sleep(0.002)

    result = measure_latency(slow, 1, repeats=5, warmup=2)
    assert len(calls) == 7
    assert set(result) == {"median_us", "p90_us"}
    assert 2000 <= result["median_us"] <= result["p90_us"]


@pytest.mark.parametrize(("repeats", "warmup"), [(0, 1), (-1, 1), (1.5, 1), (5, -1), (True, 0)])
def test_measure_latency_rejects_bad_counts(repeats, warmup):
    with pytest.raises(ValueError, match="repeats|warmup"):
        measure_latency(lambda x: x, 1, repeats=repeats, warmup=warmup)


def test_measure_interleaved_takes_turns_round_by_round_and_times_each_call():
    order = []

    def call(name, seconds):
        def fn(x):
            order.append((name, x))
            time.sleep(seconds)

        return fn

    result = measure_interleaved(
        {"slow": (call("slow", 0.003), 1), "fast": (call("fast", 0.0), 2)}, repeats=3, rounds=2, warmup=1
    )
    # each round: slow's warm-up and timed calls, then fast's; each gets its own input
    assert order == 2 * ([("slow", 1)] * 4 + [("fast", 2)] * 4)
    assert list(result) == ["slow", "fast"] and all(
        set(r) == {"median_us", "p90_us"} for r in result.values()
    )
    assert 3000 <= result["slow"]["median_us"] <= result["slow"]["p90_us"]
    assert result["fast"]["median_us"] < 1000
    with pytest.raises(ValueError, match="rounds"):
        measure_interleaved({"fast": (call("fast", 0.0), 2)}, rounds=0)


def test_compare_and_choose_backends_for_a_tiny_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    threads = torch.get_num_threads()
    timings = compare_backends(model, torch.randn(1, 4), repeats=5, warmup=1)
    assert list(timings) == list(BACKENDS)
    assert all(t["median_us"] > 0 for t in timings.values())
    assert torch.get_num_threads() == threads
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert (
        fastest_backend(model, torch.randn(1, 4), candidates=["onnx-int8"], repeats=2, warmup=0)
        == "onnx-int8"
    )
    best = fastest_backend(
        model, torch.randn(1, 4), candidates=["torch-fp32", "onnx-fp32"], repeats=5, warmup=1
    )
    assert best in ("torch-fp32", "onnx-fp32")


def test_cnn_backends_calibrate_on_the_example_when_given_no_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    timings = compare_backends(
        model, torch.rand(1, 1, 8, 8), ["torch-int8", "onnx-int8"], repeats=3, warmup=1
    )
    assert set(timings) == {"torch-int8", "onnx-int8"}


def test_bad_candidates():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="unknown backend"):
        fastest_backend(model, torch.randn(1, 2), candidates=["tensorrt"])
    with pytest.raises(ValueError, match="non-empty"):
        compare_backends(model, torch.randn(1, 2), candidates=[])
    with pytest.raises(ValueError, match="non-empty"):
        compare_backends(model, torch.randn(1, 2), candidates="onnx-fp32")
    with pytest.raises(ValueError, match="threads"):
        compare_backends(model, torch.randn(1, 2), threads=0)
