"""Exported C policies act as SB3's deterministic predict does, compiled strictly, on their own rollouts."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from torch import nn

from conftest import DEPLOY_ALGOS, DEPLOY_DISCRETE, circulant_deploy_models
from rlq.deploy import FP32_RTOL, SAME_CODES_RTOL, compile_policy, error_bound, parity
from rlq.deploy.c_build import c_compiler, load_c_policy
from rlq.deploy.export import export_policy
from rlq.deploy.export_c import CExport, write_c
from rlq.deploy.input_scaling import INPUT_SCALING
from rlq.faces.cli import main
from rlq.rl.agents import make_model
from rlq.sb3.checkpoint import save_compressed

ALGOS, DISCRETE = DEPLOY_ALGOS, DEPLOY_DISCRETE

pytestmark = pytest.mark.skipif(c_compiler() is None, reason="no C compiler (install gcc)")


@pytest.fixture(scope="module")
def models():
    """Untrained models with a 64-64 action path whose hidden layer is block-circulant (B = 8)."""
    return circulant_deploy_models(seed=3)


def rollout(env_id: str, act, steps: int = 120, seed: int = 0) -> tuple[np.ndarray, float]:
    """Return the float32 observations of a rollout acting with ``act`` (one at a time) and its mean return."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    states, returns, total = [], [], 0.0
    for _ in range(steps):
        states.append(np.asarray(obs, np.float32))
        action = act(np.asarray(obs, np.float32)[None])[0]
        if isinstance(env.action_space, gym.spaces.Discrete):
            action = int(action[0])
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        if terminated or truncated:
            returns.append(total)
            total = 0.0
            obs, _ = env.reset()
    env.close()
    return np.stack(states), float(np.mean(returns or [total]))


@pytest.mark.parametrize("algo", list(ALGOS))
def test_fp32_c_policy_acts_as_sb3_predict_on_its_rollout(models, algo, tmp_path):
    model = models[algo]
    export = write_c(model, tmp_path / "c")
    assert "circulant_fp32 B=8" in [op["kernel"] for op in export.ops]
    policy = load_c_policy(export)
    states, c_return = rollout(ALGOS[algo], policy)
    expected, _ = model.predict(states, deterministic=True)
    actions = policy(states)
    if algo in DISCRETE:
        assert export.action_dim == 1
        np.testing.assert_array_equal(actions[:, 0].astype(np.int64), expected)
    else:
        high = float(np.abs(model.action_space.high).max())
        np.testing.assert_allclose(actions, expected.reshape(actions.shape), rtol=0, atol=FP32_RTOL * high)
    # the same episodes acted by PyTorch: the same return
    _, torch_return = rollout(ALGOS[algo], lambda o: model.predict(o, deterministic=True)[0].reshape(1, -1))
    assert c_return == pytest.approx(torch_return, rel=1e-4, abs=1e-3)


@pytest.mark.parametrize("algo", ["TD3", "SAC", "PPO", "DQN"])
def test_int8_c_policy_is_within_the_quantization_bound(models, algo, tmp_path):
    model = models[algo]
    export = write_c(model, tmp_path / "c", precision="int8")
    kernels = [op["kernel"] for op in export.ops]
    assert kernels[:2] == ["dense_int8", "circulant_int8 B=8"], kernels
    policy = load_c_policy(export)
    states, _ = rollout(ALGOS[algo], policy)
    reference = compile_policy(model, "int8", use_kernels=False)
    exact, bound = error_bound(model, reference, states)
    outputs = reference.outputs(states)
    assert np.all(np.abs(outputs - exact) <= bound)
    expected, _ = model.predict(states, deterministic=True)
    actions = policy(states)
    if algo in DISCRETE:  # SB3's greedy action wherever the bound cannot flip it
        top2 = np.sort(exact, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * bound.max(axis=1) + 1e-5
        assert clear.any()
        np.testing.assert_array_equal(actions[clear, 0].astype(np.int64), expected[clear])
        # the C arithmetic is the runtime's: its greedy action wherever its own top two are not tied
        top2 = np.sort(outputs, axis=1)[:, -2:]
        untied = top2[:, 1] - top2[:, 0] > 1e-4
        np.testing.assert_array_equal(actions[untied, 0].astype(np.int64), reference(states)[untied])
    else:
        np.testing.assert_array_less(np.abs(actions - expected.reshape(actions.shape)), bound + 1e-5)
        # the C arithmetic is the runtime's: the same codes, summed in another order
        np.testing.assert_allclose(actions, reference(states), rtol=0, atol=1e-4)


def test_int8_parity_with_the_same_codes_fails_when_one_exported_weight_changes(models, tmp_path):
    model = models["TD3"]
    export = write_c(model, tmp_path / "c", precision="int8")
    states, _ = rollout("Pendulum-v1", load_c_policy(export))
    reference = compile_policy(model, "int8", use_kernels=False)(states)
    tolerance = SAME_CODES_RTOL * float(np.abs(model.action_space.high).max())
    assert parity(load_c_policy(export)(states), reference, tolerance)["within"] is True
    # one code of the first layer moved by 60 steps, as a broken exporter or a flipped byte would
    source = export.source.read_text()
    found = re.search(r"static const int8_t policy_l0_codes\[\d+\] = \{\n    (-?\d+),", source)
    code = int(found.group(1))
    broken = source[: found.start(1)] + str(code - 60 if code > 0 else code + 60) + source[found.end(1) :]
    export.source.write_text(broken)
    row = parity(load_c_policy(CExport.read(export.folder))(states), reference, tolerance)
    assert row["within"] is False and row["max |difference|"] > 10 * tolerance
    assert 0 <= row["states within"] < 1
    nan_row = parity(np.full_like(reference, np.nan), reference, tolerance)  # no action is never within
    assert nan_row["within"] is False and nan_row["states within"] == 0


def test_pruned_layer_is_exported_block_sparse_with_its_indices(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(11, 96), nn.ReLU(), nn.Linear(96, 90), nn.ReLU(), nn.Linear(90, 3), nn.Tanh()
    )
    keep = torch.rand(-(-90 // 4), 96 // 4) < 0.2  # 4 x 4 blocks, 20 % kept, 90 rows: a partial block row
    mask = keep.repeat_interleave(4, 0).repeat_interleave(4, 1)[:90]
    with torch.no_grad():
        net[2].weight.mul_(mask)
    export = write_c(net, tmp_path / "c", precision="int8")
    assert export.ops[1]["kernel"].startswith("sparse_int8 4x4 blocks"), export.ops
    dense = write_c(
        compile_policy(net, "int8", max_sparse_density=0.0, use_kernels=False), tmp_path / "dense"
    )
    assert dense.ops[1]["kernel"] == "dense_int8"
    x = np.random.default_rng(1).normal(size=(64, 11)).astype(np.float32)
    reference = compile_policy(net, "int8", use_kernels=False)
    got = load_c_policy(export)(x)
    np.testing.assert_allclose(got, reference(x), rtol=0, atol=1e-5)
    exact, bound = error_bound(net, reference, x)
    assert np.all(np.abs(got - exact) <= bound + 1e-5)
    assert export.weight_bytes < dense.weight_bytes
    for written in (export, dense):  # read back from the folder: sizes and every layer, as written
        assert CExport.read(written.folder) == written


def test_header_states_sizes_and_the_file_builds_strictly(models, tmp_path):
    export = write_c(models["TD3"], tmp_path / "c", name="pendulum")
    header = export.header.read_text()
    assert "#define PENDULUM_OBS_DIM 3" in header and "#define PENDULUM_ACTION_DIM 1" in header
    assert f"#define PENDULUM_WEIGHT_BYTES {export.weight_bytes}" in header
    assert "void pendulum_act(const float *obs, float *action);" in header
    source = export.source.read_text()
    assert "malloc" not in source and "#include <stdlib.h>" not in source
    # float32: 3x64 and 64x1 weights with biases, 8x8 blocks of 8 DFT values with a bias, the two 8x8
    # DFT tables, and the action scaling's scale, shift, low and high
    expected = 4 * (3 * 64 + 64 + 64 * 8 + 64 + 64 * 1 + 1 + 2 * 64 + 4)
    assert export.weight_bytes == expected
    # of which the DFT tables: the float arrays the file declares for B = 8, counted from the file
    tables = re.findall(r"static const float pendulum_i?dft8\[(\d+)\]", source)
    assert len(tables) == 2 and export.table_bytes == 4 * sum(map(int, tables)) == 4 * 2 * 64
    assert f"#define PENDULUM_TABLE_BYTES {export.table_bytes}" in header
    assert CExport.read(export.folder) == export  # the action scaling's layer included
    load_c_policy(export)  # -std=c99 -Wall -Wextra -Werror -pedantic


def test_vec_normalize_is_applied_first(models, tmp_path):
    model = models["TD3"]
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]), norm_reward=False, clip_obs=2.0)
    venv.obs_rms.mean = np.array([0.3, -0.2, 1.0])
    venv.obs_rms.var = np.array([0.25, 4.0, 9.0])
    policy = load_c_policy(write_c(model, tmp_path / "c", vec_normalize=venv))
    obs = np.random.default_rng(2).uniform(-8, 8, size=(50, 3)).astype(np.float32)
    expected, _ = model.predict(venv.normalize_obs(obs).astype(np.float32), deterministic=True)
    np.testing.assert_allclose(policy(obs), expected.reshape(-1, 1), rtol=0, atol=1e-4)


def test_bad_input_names_the_problem_and_writes_nothing(models, tmp_path):
    net = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 2))
    with pytest.raises(TypeError, match="SiLU"):
        write_c(net, tmp_path / "silu")
    assert not (tmp_path / "silu").exists()
    with pytest.raises(TypeError, match="nn.Sequential or a Stable-Baselines3"):
        write_c(object(), tmp_path / "object")
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError, match="taken exists"):
        write_c(models["TD3"], tmp_path / "taken")
    assert list((tmp_path / "taken").iterdir()) == []
    with pytest.raises(ValueError, match="C identifier"):
        write_c(models["TD3"], tmp_path / "name", name="my-policy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_cli_exports_a_model_file_and_refuses_an_existing_folder(models, tmp_path, capsys):
    model = models["DQN"]
    save_compressed(model, tmp_path / "dqn.zip")  # its block-circulant layer re-applied on load
    assert (
        main(["export", str(tmp_path / "dqn.zip"), "--out", str(tmp_path / "out"), "--name", "cartpole"]) == 0
    )
    assert (tmp_path / "out" / "cartpole.c").is_file() and (tmp_path / "out" / "cartpole.h").is_file()
    assert "4 -> 1" in capsys.readouterr().out
    assert "circulant_fp32 B=8" in (tmp_path / "out" / "cartpole.h").read_text()
    assert main(["export", str(tmp_path / "dqn.zip"), "--out", str(tmp_path / "out")]) == 2
    assert "exists" in capsys.readouterr().err
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    assert main(["export", str(tmp_path / "junk.zip"), "--out", str(tmp_path / "junk")]) == 2
    assert "not a Stable-Baselines3 model file" in capsys.readouterr().err
    assert not (tmp_path / "junk").exists()


@pytest.mark.parametrize("algo", list(ALGOS))
def test_onnx_export_carries_the_post_processing(models, algo, tmp_path):
    pytest.importorskip("onnxruntime")
    from rlq.quant.onnx_backend import OnnxPolicy

    model = models[algo]
    path = export_policy(model, tmp_path / "onnx", "onnx")
    states, _ = rollout(ALGOS[algo], lambda o: model.predict(o, deterministic=True)[0].reshape(1, -1))
    expected, _ = model.predict(states, deterministic=True)
    got = OnnxPolicy(path)(states)
    if algo in DISCRETE:
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_the_docs_c_example_compiles_and_prints_the_action(models, tmp_path):
    import re
    import subprocess
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "deploy.md").read_text()
    (program,) = re.findall(r"```c\n(.*?)```", page, re.S)
    assert program.count("\n") <= 25
    model = models["TD3"]
    export = write_c(model, tmp_path / "c")
    (tmp_path / "c" / "main.c").write_text(program)
    binary = tmp_path / "act"
    from rlq.deploy.c_build import compile_c

    compile_c([tmp_path / "c" / "main.c", export.source], binary, (f"-I{export.folder}",))
    printed = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    (value,) = re.findall(r"action\[0\] = (-?[0-9.]+)", printed)
    expected, _ = model.predict(np.array([[1.0, 0.0, 0.5]], np.float32), deterministic=True)
    assert float(value) == pytest.approx(float(expected[0, 0]), abs=2e-6)
    assert f"{export.weight_bytes} bytes of weights" in printed


def _docs_commands() -> list[list[str]]:
    """Return the ``rlq`` commands of docs/deploy.md's first bash block, each split as a shell would (no glob)."""
    import re
    import shlex
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "deploy.md").read_text()
    block = re.findall(r"```bash\n(.*?)```", page, re.S)[0]
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    assert all(c[0] == "rlq" for c in commands if c), commands
    return [c[1:] for c in commands if c]


def _run_as_written(command: list[str]) -> int:
    import glob

    args = [a for arg in command for a in (sorted(glob.glob(arg)) if "*" in arg else [arg])]
    return main(args)


@pytest.mark.parametrize("algo", list(ALGOS))
def test_the_docs_export_lines_run_as_written_on_each_algorithms_model_file(algo, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    make_model(algo, ALGOS[algo], hyperparams=dict(policy_kwargs=dict(net_arch=[16]))).save("model.zip")
    commands = [c for c in _docs_commands() if "model.zip" in c]
    assert len(commands) >= 3
    for command in commands:
        assert _run_as_written(command) == 0, command
    assert (tmp_path / "policy_int8" / "policy.c").is_file() and (
        tmp_path / "policy_onnx" / "policy.onnx"
    ).is_file()


@pytest.mark.slow
def test_the_docs_commands_run_as_written(tmp_path, monkeypatch):
    """Every line, the experiment that trains the job folder exported included."""
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLQ_RUNS", raising=False)
    make_model("PPO", "Pendulum-v1", hyperparams=dict(policy_kwargs=dict(net_arch=[16]))).save("model.zip")
    for command in _docs_commands():
        assert _run_as_written(command) == 0, command
    assert (tmp_path / "pendulum_c" / "policy.c").is_file()


def test_int8_onnx_is_qdq_calibrated_and_close_to_fp32(models, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnx

    from rlq.quant.onnx_backend import OnnxPolicy

    model = models["TD3"]
    states, _ = rollout("Pendulum-v1", lambda o: model.predict(o, deterministic=True)[0].reshape(1, -1))
    fp32 = export_policy(model, tmp_path / "fp32", "onnx")
    int8 = export_policy(model, tmp_path / "int8", "onnx", precision="int8", calibration=states)
    ops = {node.op_type for node in onnx.load(int8).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops, ops
    expected, _ = model.predict(states, deterministic=True)
    got = OnnxPolicy(int8)(states)
    assert np.abs(got - expected).max() < 0.05 * 2.0  # a few 8-bit steps of Pendulum's [-2, 2]
    np.testing.assert_allclose(OnnxPolicy(fp32)(states), expected, rtol=0, atol=1e-5)


def test_an_nn_module_actor_exports_with_its_action_space_and_not_without(tmp_path):
    from gymnasium import spaces

    from rlq.quant.onnx_backend import OnnxPolicy

    torch.manual_seed(1)
    actor = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2), nn.Tanh())
    with pytest.raises(ValueError, match="has no action space"):
        export_policy(actor, tmp_path / "none")
    assert not (tmp_path / "none").exists()
    box = spaces.Box(low=np.array([-1.0, 0.0], np.float32), high=np.array([3.0, 0.5], np.float32))
    x = np.random.default_rng(3).normal(size=(40, 5)).astype(np.float32)
    with torch.no_grad():
        squashed = actor(torch.from_numpy(x)).numpy()
    expected = box.low + 0.5 * (squashed + 1.0) * (box.high - box.low)  # SB3's unscale_action
    export = export_policy(actor, tmp_path / "box", action_space=box)
    np.testing.assert_allclose(load_c_policy(export)(x), expected, rtol=0, atol=1e-6)
    onnx_path = export_policy(actor, tmp_path / "box_onnx", "onnx", action_space=box)
    np.testing.assert_allclose(OnnxPolicy(onnx_path)(x), expected, rtol=0, atol=1e-6)
    logits = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 4))  # no tanh: clipped, or argmax
    with torch.no_grad():
        raw = logits(torch.from_numpy(x)).numpy()
    clip_box = spaces.Box(low=-0.1, high=0.1, shape=(4,), dtype=np.float32)
    clipped = load_c_policy(export_policy(logits, tmp_path / "clip", action_space=clip_box))(x)
    np.testing.assert_allclose(clipped, np.clip(raw, -0.1, 0.1), rtol=0, atol=1e-6)
    chosen = load_c_policy(export_policy(logits, tmp_path / "argmax", action_space=spaces.Discrete(4)))(x)
    np.testing.assert_array_equal(chosen[:, 0].astype(np.int64), raw.argmax(axis=1))
    with pytest.raises(ValueError, match="4 outputs, the Discrete action space 3"):
        export_policy(logits, tmp_path / "wrong", action_space=spaces.Discrete(3))


def test_an_sb3_model_refuses_a_second_action_space(models, tmp_path):
    from gymnasium import spaces

    with pytest.raises(ValueError, match="brings its own action space"):
        export_policy(models["TD3"], tmp_path / "c", action_space=spaces.Discrete(2))
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("bits", [2, 3, 4, 7])
def test_packed_codes_are_the_bit_stream_the_c_reader_expects(bits):
    from rlq.deploy.formats import pack_codes, unpack_codes

    codes = np.random.default_rng(bits).integers(-(2 ** (bits - 1)), 2 ** (bits - 1), size=37)
    packed = pack_codes(codes, bits)
    assert packed.dtype == np.uint8 and len(packed) == -(-37 * bits // 8) + 1 and packed[-1] == 0
    # an independent reading: stream bit k is bit k % 8 of byte k // 8, code i is bits [i b, (i + 1) b)
    as_int = int.from_bytes(packed.tobytes(), "little")
    for i, code in enumerate(codes):
        field = (as_int >> (i * bits)) & ((1 << bits) - 1)
        assert field - (1 << bits) * (field >> (bits - 1)) == code
    np.testing.assert_array_equal(unpack_codes(packed, bits, 37), codes)
    with pytest.raises(ValueError, match=f"signed {bits}-bit range"):
        pack_codes(np.array([2 ** (bits - 1)]), bits)


@pytest.mark.parametrize("bits", [2, 4])
def test_low_bit_c_policy_runs_the_packed_codes_within_the_bound(models, bits, tmp_path):
    model = models["TD3"]
    export = write_c(model, tmp_path / "c", precision=f"int{bits}")
    kernels = [op["kernel"] for op in export.ops]
    assert kernels[0] == kernels[2] == f"dense_lowbit {bits}-bit" and kernels[1] == "circulant_int8 B=8"
    reference = compile_policy(model, f"int{bits}")
    assert not reference.compiled  # no compiled kernel: NumPy computes it
    states, _ = rollout("Pendulum-v1", load_c_policy(export))
    actions = load_c_policy(export)(states)
    np.testing.assert_allclose(actions, reference(states), rtol=0, atol=1e-4)
    exact, bound = error_bound(model, reference, states)
    expected, _ = model.predict(states, deterministic=True)
    np.testing.assert_array_less(np.abs(actions - expected.reshape(actions.shape)), bound + 1e-5)
    # the first layer's 3x64 codes take 3 * 64 * bits bits in the stream, plus its trailing byte
    source = export.source.read_text()
    assert f"static const uint8_t policy_l0_codes{bits}[{-(-3 * 64 * bits // 8) + 1}]" in source
    assert export.weight_bytes < write_c(model, tmp_path / "int8", precision="int8").weight_bytes


def test_weights_on_a_4_bit_grid_are_stored_exactly(tmp_path):
    from rlq.quant.tensor import quantize_tensor

    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(6, 40), nn.ReLU(), nn.Linear(40, 2))
    with torch.no_grad():  # what a 4-bit QAT layer multiplies by: per-row symmetric codes times scales
        for layer in (net[0], net[2]):
            layer.weight.copy_(quantize_tensor(layer.weight, 4, per_channel_axis=0))
    compiled = compile_policy(net, "int4")
    for op, layer in zip([compiled.ops[0], compiled.ops[1]], (net[0], net[2]), strict=True):
        np.testing.assert_allclose(op.effective_weight(), layer.weight.detach().double().numpy(), rtol=1e-6)
    x = np.random.default_rng(4).normal(size=(30, 6)).astype(np.float32)
    got = load_c_policy(write_c(compiled, tmp_path / "c"))(x)
    np.testing.assert_allclose(got, compiled(x), rtol=0, atol=1e-5)


def test_a_4_bit_qat_policy_exports_its_own_codes(tmp_path):
    from rlq.deploy.reader import read_policy
    from rlq.sb3.qat_policy import convert_policy_qat_, prepare_policy_qat_

    model = make_model("TD3", "Pendulum-v1", seed=1, hyperparams=dict(policy_kwargs=dict(net_arch=[64, 64])))
    prepare_policy_qat_(model.policy, 4)
    convert_policy_qat_(
        model.policy
    )  # each weight row now takes at most 16 values: QAT's codes times a scale
    export = write_c(model, tmp_path / "c", precision="int4")
    assert [op["kernel"] for op in export.ops][:3] == ["dense_lowbit 4-bit"] * 3
    compiled = compile_policy(model, "int4")
    specs, _ = read_policy(model)
    for spec, op in zip(
        specs, compiled.ops, strict=False
    ):  # the packed codes are QAT's, not a second rounding
        np.testing.assert_allclose(op.effective_weight(), spec.weight, rtol=0, atol=1e-7)
    states, _ = rollout("Pendulum-v1", load_c_policy(export))
    expected, _ = model.predict(states, deterministic=True)
    _, bound = error_bound(model, compiled, states)
    actions = load_c_policy(export)(states)
    assert np.all(np.abs(actions - expected.reshape(actions.shape)) <= bound + 1e-5)


def test_input_scaling_is_exported_as_the_runtime_computes_it(models, tmp_path):
    # Pendulum's observation: cos and sin within 1, the angular velocity up to 8
    model = models["TD3"]
    states, _ = rollout("Pendulum-v1", lambda o: model.predict(o, deterministic=True)[0].reshape(1, -1))
    calibration, held_out = states[:60], states[60:]
    export = write_c(model, tmp_path / "c", precision="int8", calibration=calibration)
    assert [op["name"] for op in export.ops][0] == INPUT_SCALING
    reference = compile_policy(model, "int8", calibration=calibration, use_kernels=False)
    tolerance = SAME_CODES_RTOL * float(np.abs(model.action_space.high).max())
    assert parity(load_c_policy(export)(held_out), reference(held_out), tolerance)["within"] is True
    exact, bound = error_bound(model, reference, held_out)
    assert np.all(np.abs(reference.outputs(held_out) - exact) <= bound)
    with pytest.raises(ValueError, match="compiled already"):
        write_c(reference, tmp_path / "again", precision="int8", calibration=calibration)
    assert not (tmp_path / "again").exists()


def test_input_scaling_calibrates_on_observations_as_the_network_sees_them(models, tmp_path):
    model = models["TD3"]
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]), norm_reward=False, clip_obs=5.0)
    venv.obs_rms.mean = np.array([0.3, -0.2, 1.0])
    venv.obs_rms.var = np.array([0.25, 4.0, 9.0])
    obs = np.random.default_rng(4).uniform(-8, 8, size=(80, 3)).astype(np.float32)
    calibration, held_out = obs[:40], obs[40:]
    policy = load_c_policy(
        write_c(model, tmp_path / "c", precision="int8", vec_normalize=venv, calibration=calibration)
    )
    seen = venv.normalize_obs(calibration).astype(np.float32)
    reference = compile_policy(model, "int8", calibration=seen, use_kernels=False)
    expected = reference(venv.normalize_obs(held_out).astype(np.float32))
    np.testing.assert_allclose(policy(held_out), expected, rtol=0, atol=1e-4)


def test_an_nn_module_actor_exports_its_input_scaling(tmp_path):
    from gymnasium import spaces

    torch.manual_seed(2)
    actor = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2), nn.Tanh())
    box = spaces.Box(low=-2.0, high=2.0, shape=(2,), dtype=np.float32)
    x = (np.random.default_rng(5).normal(size=(60, 5)) * [0.1, 0.1, 1.0, 10.0, 10.0]).astype(np.float32)
    export = export_policy(actor, tmp_path / "c", action_space=box, precision="int8", calibration=x[:30])
    compiled = compile_policy(actor, "int8", calibration=x[:30], use_kernels=False)
    assert compiled.ops[0].name == INPUT_SCALING
    expected = 2.0 * compiled.outputs(x[30:])  # SB3's unscale_action to [-2, 2]
    np.testing.assert_allclose(load_c_policy(export)(x[30:]), expected, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="precision='fp32' quantizes none"):
        export_policy(actor, tmp_path / "fp32", action_space=box, calibration=x)
    assert not (tmp_path / "fp32").exists()


def test_cli_exports_with_calibration_observations_from_a_npy_file(models, tmp_path, capsys):
    model = models["TD3"]
    save_compressed(model, tmp_path / "td3.zip")
    states, _ = rollout("Pendulum-v1", lambda o: model.predict(o, deterministic=True)[0].reshape(1, -1))
    np.save(tmp_path / "states.npy", states[:60])
    args = [
        "export",
        str(tmp_path / "td3.zip"),
        "--precision",
        "int8",
        "--calibration",
        str(tmp_path / "states.npy"),
    ]
    assert main([*args, "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    policy = load_c_policy(CExport.read(tmp_path / "out"))
    expected = load_c_policy(write_c(model, tmp_path / "python", precision="int8", calibration=states[:60]))
    np.testing.assert_array_equal(policy(states[60:]), expected(states[60:]))
    (tmp_path / "text.npy").write_text("not an array")
    args[-1] = str(tmp_path / "text.npy")
    assert main([*args, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "not a NumPy .npy array" in err and len(err.strip().splitlines()) == 1
    np.save(tmp_path / "narrow.npy", states[:60, :2])
    args[-1] = str(tmp_path / "narrow.npy")
    assert main([*args, "--out", str(tmp_path / "narrow")]) == 2
    assert "shape (n, 3)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["out", "python"]
