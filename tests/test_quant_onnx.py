"""ONNX export (fp32, int8 dynamic and static) and OnnxPolicy: outputs match torch; files are never clobbered."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn

from rlq.quant import OnnxPolicy, export_onnx, model_size_bytes


def mlp(seed: int = 0, width: int = 32) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(5, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 3)
    )


def cnn(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 8, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 5 * 5, 4))


X = torch.randn(7, 5, generator=torch.Generator().manual_seed(3))
IMAGES = torch.rand(6, 2, 11, 11, generator=torch.Generator().manual_seed(4))


def op_types(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def test_fp32_matches_torch_for_tensors_and_arrays_at_any_batch(tmp_path):
    model = mlp().train()
    path = export_onnx(model, tmp_path / "policy.onnx", X[:1])
    assert path == tmp_path / "policy.onnx" and path.is_file()
    assert model.training  # the export ran in eval mode and restored the mode
    policy = OnnxPolicy(path)
    out = policy(X)  # batch 7 through a model exported at batch 1
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, model(X).detach(), atol=1e-5, rtol=1e-5)
    array = policy(X.numpy().astype(np.float64))
    assert isinstance(array, np.ndarray) and array.dtype == np.float32
    np.testing.assert_allclose(array, model(X).detach().numpy(), atol=1e-5, rtol=1e-5)
    assert policy([[0.0] * 5]).shape == (1, 3)


def test_int8_dynamic_mlp(tmp_path):
    model = mlp(width=128)
    fp32 = export_onnx(model, tmp_path / "fp32.onnx", X)
    int8 = export_onnx(model, tmp_path / "int8.onnx", X, "int8")
    assert "MatMulInteger" in op_types(int8)
    assert model_size_bytes(int8) < 0.4 * model_size_bytes(fp32)
    expected = model(X).detach()
    torch.testing.assert_close(OnnxPolicy(int8)(X), expected, atol=0.02, rtol=0.05)


def test_int8_static_cnn(tmp_path):
    model = cnn()
    path = export_onnx(model, tmp_path / "cnn.onnx", IMAGES[:1], "int8", calibration=[IMAGES[:3], IMAGES[3:]])
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= op_types(path)
    torch.testing.assert_close(OnnxPolicy(path)(IMAGES), model(IMAGES).detach(), atol=0.02, rtol=0.1)


def test_int8_cnn_without_calibration_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs calibration data"):
        export_onnx(cnn(), tmp_path / "cnn.onnx", IMAGES[:1], "int8")
    assert not (tmp_path / "cnn.onnx").exists()


def test_fp32_cnn_and_multiple_outputs(tmp_path):
    model = cnn()
    path = export_onnx(model, tmp_path / "cnn.onnx", IMAGES[:1].numpy())
    torch.testing.assert_close(OnnxPolicy(path)(IMAGES), model(IMAGES).detach(), atol=1e-5, rtol=1e-5)

    class ActorCritic(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.pi, self.v = nn.Linear(5, 8), nn.Linear(8, 2), nn.Linear(8, 1)

        def forward(self, x):
            h = torch.relu(self.body(x))
            return self.pi(h), self.v(h)

    two = ActorCritic()
    path = export_onnx(two, tmp_path / "ac.onnx", X)
    policy = OnnxPolicy(path)
    assert policy.output_names == ["output_0", "output_1"]
    pi, v = policy(X)
    torch.testing.assert_close(pi, two(X)[0].detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v, two(X)[1].detach(), atol=1e-5, rtol=1e-5)


def test_refuses_to_overwrite(tmp_path):
    path = tmp_path / "sub" / "policy.onnx"
    export_onnx(mlp(0), path, X)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_onnx(mlp(1), path, X)
    with pytest.raises(FileExistsError):
        export_onnx(mlp(1), path, X, "int8")
    assert path.read_bytes() == before
    export_onnx(mlp(1), path, X, overwrite=True)
    assert path.read_bytes() != before
    torch.testing.assert_close(OnnxPolicy(path)(X), mlp(1)(X).detach(), atol=1e-5, rtol=1e-5)
    assert sorted(p.name for p in path.parent.iterdir()) == ["policy.onnx"]  # no staging file left


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="choose one of fp32, int8"):
        export_onnx(mlp(), tmp_path / "a.onnx", X, "int4")
    with pytest.raises(TypeError, match="nn.Module"):
        export_onnx("model", tmp_path / "a.onnx", X)
    with pytest.raises(ValueError, match="no Conv, Gemm or MatMul"):
        export_onnx(nn.Sequential(nn.ReLU()), tmp_path / "b.onnx", X, "int8")
    with pytest.raises(FileNotFoundError):
        OnnxPolicy(tmp_path / "missing.onnx")
    path = export_onnx(mlp(), tmp_path / "c.onnx", X)
    for threads in [0, -1, 1.5, True]:
        with pytest.raises(ValueError, match="threads"):
            OnnxPolicy(path, threads=threads)


def test_int8_export_refuses_non_finite_weights_naming_the_layer(tmp_path):
    model = mlp()
    with torch.no_grad():
        model[2].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="the weight of layer '2' to int8: it holds 1 NaN"):
        export_onnx(model, tmp_path / "int8.onnx", X, "int8")
    assert not (tmp_path / "int8.onnx").exists()
