"""model_size_bytes counts what is really serialized; packed n-bit weights round-trip; relative_change."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from rlq.quant import (
    model_size_bytes,
    pack_state_dict,
    ptq,
    quantize_tensor,
    relative_change,
    unpack_state_dict,
)
from rlq.quant.size import pack_codes, unpack_codes


def model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))


def torch_save_size(obj) -> int:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return len(buffer.getvalue())


def test_size_of_a_module_is_its_serialized_state_dict():
    m = model()
    assert model_size_bytes(m) == torch_save_size(m.state_dict())
    n_params = sum(p.numel() for p in m.parameters())
    assert 4 * n_params < model_size_bytes(m) < 4 * n_params * 1.05


def payload_bytes(m: nn.Module, bits: int) -> int:
    """Weights at ``bits`` bits, packed; biases and one scale per output channel in float32."""
    layers = [layer for layer in m.modules() if isinstance(layer, nn.Linear)]
    weights = sum(math.ceil(layer.weight.numel() * bits / 8) for layer in layers)
    return weights + 4 * sum(layer.bias.numel() + layer.out_features for layer in layers)


def test_sizes_at_lower_precisions():
    m = model()
    n_params = sum(p.numel() for p in m.parameters())
    overhead = model_size_bytes(m, "fp32") - 4 * n_params  # torch.save's zip entries and pickled keys
    assert 0 < overhead < 4000
    assert 0 < model_size_bytes(m, "fp16") - 2 * n_params < 4000
    assert model_size_bytes(m, "bf16") == model_size_bytes(m, "fp16")
    for bits in (2, 4, 8):
        assert 0 < model_size_bytes(m, f"int{bits}") - payload_bytes(m, bits) < 6000
    real_int8 = model_size_bytes(ptq(m, "int8"))  # torch's own int8 state dict (packed params)
    assert real_int8 == pytest.approx(model_size_bytes(m, "int8"), rel=0.1)
    assert model_size_bytes(m) == torch_save_size(m.state_dict())  # the module was not changed


def test_size_of_a_file(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"x" * 1234)
    assert model_size_bytes(path) == 1234 == model_size_bytes(str(path))
    with pytest.raises(ValueError, match="precision=None"):
        model_size_bytes(path, "int8")
    with pytest.raises(FileNotFoundError):
        model_size_bytes(tmp_path / "missing.onnx")
    with pytest.raises(TypeError):
        model_size_bytes(42)
    with pytest.raises(ValueError, match="unknown precision"):
        model_size_bytes(model(), "int32")


@pytest.mark.parametrize("bits", [2, 3, 5, 8, 11, 16])
def test_pack_codes_round_trip(bits):
    codes = torch.randint(0, 2**bits, (1001,), generator=torch.Generator().manual_seed(bits))
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(1001 * bits / 8)
    assert torch.equal(unpack_codes(packed, bits, 1001), codes)
    with pytest.raises(ValueError, match="must lie in"):
        pack_codes(torch.tensor([2**bits]), bits)
    with pytest.raises(ValueError, match="fewer than"):
        unpack_codes(packed, bits, 2000)


@pytest.mark.parametrize("bits", [3, 8])
def test_packed_state_dict_round_trip(bits):
    m = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    packed = pack_state_dict(m, bits)
    assert packed["0.weight.codes"].dtype == torch.uint8
    restored = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    restored.load_state_dict(unpack_state_dict(packed))
    for i in (0, 3):
        assert torch.equal(restored[i].weight, quantize_tensor(m[i].weight, bits, per_channel_axis=0))
        assert torch.equal(restored[i].bias, m[i].bias)
    if bits != 8:  # simulated PTQ per channel gives the same weights
        assert torch.equal(ptq(m, f"int{bits}", per_channel_linear=True)[3].weight, restored[3].weight)


def test_relative_change():
    assert relative_change(25, 100) == -0.75
    assert relative_change(3.0, -2.0) == 2.5
    assert relative_change(1, 1) == 0.0
    for bad in [0, math.inf, math.nan]:
        with pytest.raises(ValueError, match="non-zero"):
            relative_change(1.0, bad)


def test_packing_refuses_non_finite_weights_naming_them():
    m = model()
    with torch.no_grad():
        m[2].weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match="the weight '2.weight': it holds 0 NaN and 1 inf"):
        model_size_bytes(m, "int4")


# ---- packed files: what bits_per_weight counts, on disk and back


def combined_policy() -> nn.Sequential:
    """A 64-wide actor: dense fp32 first layer, block-circulant + pruned middle, pruned last, all QAT but the first."""
    from rlq.compress import magnitude_prune_, make_block_circulant_
    from rlq.quant import WeightFakeQuant
    from rlq.sb3.qat_stacking import stack_fake_quant_

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2), nn.Tanh())
    make_block_circulant_(m[2], 4)
    magnitude_prune_(m, 0.5, skip_first_last=False, layers=["2"])
    magnitude_prune_(m, 0.9, skip_first_last=False, layers=["4"])
    stack_fake_quant_(m[2], [WeightFakeQuant(4, axis=0)])
    stack_fake_quant_(m[4], [WeightFakeQuant(8, axis=0)])
    return m.eval()


def plain_policy() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2), nn.Tanh()
    )


def test_expand_block_circulant_matches_rlq_compress():
    from rlq.compress import expand_circulant
    from rlq.quant.size import expand_block_circulant

    for shape in [(2, 3, 4), (2, 2, 2, 3, 3)]:
        vectors = torch.randn(shape)
        assert torch.equal(expand_block_circulant(vectors), expand_circulant(vectors))


def test_packed_file_round_trips_and_its_size_is_bits_per_weight(tmp_path):
    from rlq.quant import bits_per_weight, size_report
    from rlq.quant.size import load_packed, packed_header, save_packed

    model = combined_policy()
    path = save_packed(model, tmp_path / "policy.rlqp")
    header = packed_header(path)
    weight_bytes = sum(sum(entry["bytes"][:3]) for entry in header["layers"])
    bias_bytes = sum(entry["bytes"][3] for entry in header["layers"])
    counted_bits = sum(r["total_bits"] for r in size_report(model))
    dense = sum(r["dense"] for r in size_report(model))
    assert bits_per_weight(model) == pytest.approx(counted_bits / dense)
    assert counted_bits <= 8 * weight_bytes <= 1.1 * counted_bits  # bytes round up per section only
    assert path.stat().st_size == header["header_bytes"] + weight_bytes + bias_bytes
    assert header["header_bytes"] < 400 * len(header["layers"])  # a small header
    kinds = [entry["kind"] for entry in header["layers"]]
    assert kinds == ["dense", "block_circulant+pruned", "pruned"]

    fresh = plain_policy()
    fresh.load_state_dict(load_packed(path))
    x = torch.randn(256, 8)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("bits", [None, "fp16", 4])
def test_packed_file_round_trips_dense_models(tmp_path, bits):
    from rlq.quant import ptq
    from rlq.quant.size import load_packed, save_packed

    torch.manual_seed(1)
    model = plain_policy().eval()
    reference = ptq(model, "int4", per_channel_linear=True) if bits == 4 else model
    path = save_packed(reference, tmp_path / "m.rlqp", bits=bits, per_channel=True)
    fresh = plain_policy()
    fresh.load_state_dict(load_packed(path))
    x = torch.randn(64, 8)
    with torch.no_grad():
        atol = 1e-3 if bits == "fp16" else 1e-6
        torch.testing.assert_close(fresh(x), reference(x), rtol=0, atol=atol)


def test_int8_onnx_of_the_packed_policy_acts_like_torch(tmp_path):
    """int8 ONNX Runtime of the unpacked policy: max |a_torch - a_onnx| <= 1e-2 in action units."""
    from rlq.quant import OnnxPolicy, export_onnx
    from rlq.quant.size import load_packed, save_packed

    model = combined_policy()
    fresh = plain_policy().eval()
    fresh.load_state_dict(load_packed(save_packed(model, tmp_path / "p.rlqp")))
    torch.manual_seed(2)
    obs = torch.randn(256, 8)
    onnx = OnnxPolicy(export_onnx(fresh, tmp_path / "p.onnx", obs[:1], precision="int8"))
    with torch.no_grad():
        a_torch = model(obs).numpy()
    a_onnx = onnx(obs)
    a_onnx = a_onnx.numpy() if hasattr(a_onnx, "numpy") else a_onnx
    assert float(abs(a_torch - a_onnx).max()) <= 1e-2


def test_packed_files_of_format_1_still_load(tmp_path):
    """tests/data/packed_format1.rlqp: combined_policy() saved by rlq before filler codes (gap - 1 in 6 bits)."""
    from rlq.quant.size import PACKED_FORMAT, load_packed, packed_header, save_packed

    old = Path(__file__).parent / "data" / "packed_format1.rlqp"
    header = packed_header(old)
    assert header["format"] == 1 and header["layers"][2]["index_format"] == "relative"
    assert header["layers"][2]["index_width"] == 6
    new = save_packed(combined_policy(), tmp_path / "new.rlqp")
    layer = packed_header(new)["layers"][2]
    assert packed_header(new)["format"] == PACKED_FORMAT == 3
    # 13 kept of 128: 4-bit codes with fillers
    assert (layer["index_format"], layer["index_width"]) == ("relative", 4)
    assert layer["index_fillers"] > 0
    old_state, new_state = load_packed(old), load_packed(new)
    assert old_state.keys() == new_state.keys()
    for key in old_state:
        assert torch.equal(old_state[key], new_state[key]), key


def test_damaged_packed_files_are_refused_naming_the_problem(tmp_path):
    from rlq.quant.size import load_packed, save_packed

    path = save_packed(combined_policy(), tmp_path / "p.rlqp")
    data = path.read_bytes()
    (tmp_path / "short.rlqp").write_bytes(data[:-40])
    with pytest.raises(ValueError, match="truncated"):
        load_packed(tmp_path / "short.rlqp")
    (tmp_path / "future.rlqp").write_bytes(data.replace(b'"format":3', b'"format":9', 1))
    with pytest.raises(ValueError, match="packed format 9"):
        load_packed(tmp_path / "future.rlqp")
    (tmp_path / "other.rlqp").write_bytes(b"PK" + data[2:])
    with pytest.raises(ValueError, match="not a packed rlq file"):
        load_packed(tmp_path / "other.rlqp")


def block_pruned_policy() -> nn.Sequential:
    """A 64-wide actor whose 20x64 middle layer keeps whole 16x4 blocks (its edge block row holds 4 rows), int8 per row."""
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 20), nn.ReLU(), nn.Linear(20, 2), nn.Tanh())
    grid = torch.zeros(2, 16)
    grid[0, [1, 5, 6]] = 1  # three blocks of the first block row, one of the edge row
    grid[1, 15] = 1
    mask = grid.repeat_interleave(16, 0).repeat_interleave(4, 1)[:20]
    from rlq.compress.masks import prune_with_mask_

    prune_with_mask_(m[2], "weight", mask)
    return m.eval()


def test_a_packed_file_with_a_block_index_round_trips_and_its_size_is_bits_per_weight(tmp_path):
    from rlq.quant import size_report
    from rlq.quant.size import load_packed, packed_header, save_packed

    model = block_pruned_policy()
    path = save_packed(model, tmp_path / "block.rlqp", bits=8, per_channel=True, block=(16, 4))
    header = packed_header(path)
    middle = header["layers"][1]
    # 32 blocks, 4 kept: a 32-bit block bitmask against relative block indices (gaps 2, 4, 1, 25: w=5, 20 bits)
    assert (middle["index_format"], middle["index_block"], middle["index_entries"]) == (
        "block_relative",
        [16, 4],
        4,
    )
    assert middle["stored"] == 3 * 64 + 4 * 4
    assert middle["bytes"][0] == 3  # 20 bits of index, in whole bytes
    rows = size_report(model, bits=8, per_channel=True, block=(16, 4))
    for entry, row in zip(header["layers"], rows, strict=True):
        assert row["index_bits"] <= 8 * entry["bytes"][0] < row["index_bits"] + 8
    fresh = plain_policy_20()
    fresh.load_state_dict(load_packed(path))
    reference = plain_policy_20()
    reference.load_state_dict(
        load_packed(save_packed(model, tmp_path / "element.rlqp", bits=8, per_channel=True))
    )
    for key, value in reference.state_dict().items():  # the same weights as the element-indexed file
        assert torch.equal(fresh.state_dict()[key], value), key
    assert torch.equal(fresh[2].weight == 0, model[2].weight_mask == 0)


def plain_policy_20() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 20), nn.ReLU(), nn.Linear(20, 2), nn.Tanh()
    )
