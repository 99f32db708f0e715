"""rlq.deploy.cortex_m: a C policy cross-compiled for the Cortex-M4 and run in QEMU acts as it does on the host.

The policy is a stand-in for the C exporter's output, written here with the same interface (``policy.h``
with ``NAME_OBS_DIM``/``NAME_ACTION_DIM``, ``policy.c`` with ``NAME_act``): a dense 11-64-64-3 MLP, ReLU
hidden layers and a tanh output, its float32 weights as ``const`` hex-float literals.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rlq.deploy import cortex_m

needs_tools = pytest.mark.skipif(
    not cortex_m.tools_available(),
    reason=f"arm-none-eabi-gcc, newlib or qemu-system-arm absent: install them with `{cortex_m.INSTALL_COMMAND}`",
)
SIZES = (11, 64, 64, 3)


def test_the_tools_are_installed_where_ci_requires_them():
    if os.environ.get("RLQ_REQUIRE_EXPORT_TOOLS") == "1":
        assert cortex_m.tools_available(), (
            f"RLQ_REQUIRE_EXPORT_TOOLS=1 but the tools are absent: {cortex_m.INSTALL_COMMAND}"
        )


def _literals(values: np.ndarray) -> str:
    return ", ".join(float(x).hex() + "f" for x in values.ravel())


def write_dense_policy(
    c_dir: Path, name: str, layers: list[tuple[np.ndarray, np.ndarray]], extra: str = ""
) -> None:
    """Write NAME.h and NAME.c computing tanh(W_n relu(... relu(W_1 x + b_1)) + b_n); ``extra`` goes into NAME_act."""
    c_dir.mkdir(parents=True, exist_ok=True)
    prefix = name.upper()
    obs_dim, action_dim = layers[0][0].shape[1], layers[-1][0].shape[0]
    c_dir.joinpath(f"{name}.h").write_text(
        f"#ifndef {prefix}_H\n#define {prefix}_H\n"
        f"#define {prefix}_OBS_DIM {obs_dim}\n#define {prefix}_ACTION_DIM {action_dim}\n"
        f"void {name}_act(const float *obs, float *action);\n#endif\n"
    )
    arrays, steps = [], []
    for k, (weight, bias) in enumerate(layers):
        rows, cols = weight.shape
        arrays.append(f"static const float W{k}[{rows * cols}] = {{{_literals(weight)}}};")
        arrays.append(f"static const float B{k}[{rows}] = {{{_literals(bias)}}};")
        src = "obs" if k == 0 else f"h{k - 1}"
        last = k == len(layers) - 1
        dst = "action" if last else f"h{k}"
        steps.append(
            ("" if last else f"    float h{k}[{rows}];\n")
            + f"    for (int i = 0; i < {rows}; i++) {{\n        float s = B{k}[i];\n"
            f"        for (int j = 0; j < {cols}; j++) {{\n            s += W{k}[i * {cols} + j] * {src}[j];\n        }}\n"
            + (f"        {dst}[i] = tanhf(s);\n" if last else f"        {dst}[i] = s > 0.0f ? s : 0.0f;\n")
            + "    }\n"
        )
    c_dir.joinpath(f"{name}.c").write_text(
        f'#include <math.h>\n#include <stdint.h>\n#include "{name}.h"\n\n'
        + "\n".join(arrays)
        + f"\n\nvoid {name}_act(const float *obs, float *action)\n{{\n{extra}"
        + "".join(steps)
        + "}\n"
    )


def random_layers(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (
            rng.normal(0, 1 / np.sqrt(n_in), (n_out, n_in)).astype(np.float32),
            rng.normal(0, 0.1, n_out).astype(np.float32),
        )
        for n_in, n_out in zip(SIZES[:-1], SIZES[1:], strict=False)
    ]


def numpy_forward(layers: list[tuple[np.ndarray, np.ndarray]], obs: np.ndarray) -> np.ndarray:
    h = obs.astype(np.float32)
    for k, (weight, bias) in enumerate(layers):
        h = h @ weight.T + bias
        h = np.tanh(h) if k == len(layers) - 1 else np.maximum(h, 0)
    return h


def host_actions(c_dir: Path, name: str, obs: np.ndarray, action_dim: int) -> np.ndarray:
    """The same policy.c compiled for this machine and called through ctypes."""
    library = c_dir / "host_policy.so"
    subprocess.run(
        ["cc", "-O2", "-std=c99", "-shared", "-fPIC", str(c_dir / "policy.c"), "-lm", "-o", str(library)],
        check=True,
    )
    act = getattr(ctypes.CDLL(str(library)), f"{name}_act")
    pointer = ctypes.POINTER(ctypes.c_float)
    out = np.zeros((len(obs), action_dim), dtype=np.float32)
    for row, result in zip(np.ascontiguousarray(obs, dtype=np.float32), out, strict=True):
        act(row.ctypes.data_as(pointer), result.ctypes.data_as(pointer))
    return out


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """The stand-in policy, its ELF on 8 observations, and one QEMU run of it."""
    root = tmp_path_factory.mktemp("cortex_m")
    layers = random_layers()
    write_dense_policy(root / "c", "policy", layers)
    obs = np.random.default_rng(1).normal(0, 1, (8, SIZES[0])).astype(np.float32)
    elf = cortex_m.build_cortex_m(root / "c", "policy", obs, root / "build")
    actions, instructions = cortex_m.run_qemu(elf)
    return {
        "root": root,
        "layers": layers,
        "obs": obs,
        "elf": elf,
        "actions": actions,
        "instructions": instructions,
    }


@needs_tools
def test_the_m4_acts_as_the_host_compiled_c_and_as_numpy(dense):
    actions = dense["actions"]
    assert actions.shape == (8, SIZES[-1]) and actions.dtype == np.float32
    np.testing.assert_allclose(actions, numpy_forward(dense["layers"], dense["obs"]), rtol=0, atol=1e-5)
    if shutil.which("cc") is None:
        pytest.skip("no host C compiler (cc) to compare with")
    host = host_actions(dense["root"] / "c", "policy", dense["obs"], SIZES[-1])
    np.testing.assert_allclose(actions, host, rtol=0, atol=1e-6)


@needs_tools
def test_sizes_count_the_weights_and_the_policy_apart_from_the_harness(dense):
    elf = cortex_m.section_sizes(dense["elf"])
    assert min(elf.values()) > 0
    assert elf["flash"] == elf["text"] + elf["data"] and elf["ram"] == elf["data"] + elf["bss"]
    policy = cortex_m.policy_object_sizes(dense["root"] / "c", dense["root"] / "obj")
    weight_bytes = 4 * sum(w.size + b.size for w, b in dense["layers"])
    assert weight_bytes < policy["flash"] < weight_bytes + 2048
    assert policy["flash"] < elf["flash"]
    assert policy["ram"] == 0  # the weights are const, the activations live on the stack
    assert 0 < policy["code"] <= policy["flash"] - weight_bytes  # the instructions, apart from the weights


@needs_tools
def test_instruction_counts_are_positive_and_the_same_on_every_run(dense):
    counts = dense["instructions"]
    assert counts.shape == (8,) and counts.dtype == np.int64
    # at least one multiply-accumulate instruction per weight
    assert (counts > sum(w.size for w, _ in dense["layers"])).all()
    actions, again = cortex_m.run_qemu(dense["elf"])
    np.testing.assert_array_equal(again, counts)
    np.testing.assert_array_equal(actions, dense["actions"])


@needs_tools
def test_the_count_grows_by_exactly_the_instructions_added_to_the_policy(tmp_path):
    layers = random_layers(2)
    obs = np.random.default_rng(3).normal(0, 1, (3, SIZES[0]))
    counts = []
    for nops in (0, 37):
        write_dense_policy(
            tmp_path / f"c{nops}",
            "pi",
            layers,
            extra=f'    __asm__ volatile(".rept {nops}\\n\\tnop\\n\\t.endr");\n',
        )
        elf = cortex_m.build_cortex_m(tmp_path / f"c{nops}", "pi", obs, tmp_path / f"build{nops}")
        counts.append(cortex_m.run_qemu(elf)[1])
    np.testing.assert_array_equal(counts[1] - counts[0], 37)


@needs_tools
def test_a_compile_error_names_the_file_line_and_message(tmp_path):
    write_dense_policy(tmp_path / "c", "policy", random_layers())
    source = (tmp_path / "c" / "policy.c").read_text().splitlines()
    source.insert(3, "static int broken = ;")
    (tmp_path / "c" / "policy.c").write_text("\n".join(source) + "\n")
    with pytest.raises(RuntimeError, match=r"policy\.c:4:\d+: error: expected expression"):
        cortex_m.build_cortex_m(tmp_path / "c", "policy", np.zeros((1, SIZES[0])), tmp_path / "build")


@needs_tools
def test_a_warning_fails_the_build(tmp_path):
    write_dense_policy(tmp_path / "c", "policy", random_layers(), extra="    int unused = 0;\n")
    with pytest.raises(RuntimeError, match=r"unused variable 'unused'"):
        cortex_m.build_cortex_m(tmp_path / "c", "policy", np.zeros((1, SIZES[0])), tmp_path / "build")


@needs_tools
def test_observations_of_another_width_are_refused(tmp_path):
    write_dense_policy(tmp_path / "c", "policy", random_layers())
    with pytest.raises(ValueError, match=r"shape \(steps >= 1, 11\)"):
        cortex_m.build_cortex_m(tmp_path / "c", "policy", np.zeros((2, 4)), tmp_path / "build")


def test_absent_tools_raise_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(cortex_m.shutil, "which", lambda tool: None)
    assert not cortex_m.tools_available()
    with pytest.raises(RuntimeError, match="make export-tools"):
        cortex_m.build_cortex_m(tmp_path, "policy", np.zeros((1, 3)), tmp_path / "build")
    with pytest.raises(RuntimeError, match="make export-tools"):
        cortex_m.run_qemu(tmp_path / "policy.elf")


@pytest.fixture(scope="module")
def pendulum_actor():
    """An untrained TD3 Pendulum-v1 model, 256-256 action path, its hidden layer block-circulant (B = 16)."""
    import torch

    from rlq.compress import block_circulant_
    from rlq.rl.agents import make_model
    from rlq.sb3.action_path import action_network

    torch.set_num_threads(1)
    model = make_model(
        "TD3", "Pendulum-v1", seed=4, hyperparams=dict(policy_kwargs=dict(net_arch=[256, 256]))
    )
    assert block_circulant_(action_network(model)[0], 16).compressed
    obs = np.random.default_rng(5).uniform(-1, 1, (6, 3)).astype(np.float32)
    obs[:, 2] *= 8.0  # angular velocity in [-8, 8]
    return model, obs


@needs_tools
@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_an_exported_compressed_actor_acts_on_the_m4_as_in_pytorch(pendulum_actor, precision, tmp_path):
    from rlq.deploy import compile_policy, error_bound, write_c

    model, obs = pendulum_actor
    export = write_c(model, tmp_path / "c", precision=precision)
    elf = cortex_m.build_cortex_m(export.folder, export.name, obs, tmp_path / "build")
    actions, counts = cortex_m.run_qemu(elf)
    expected, _ = model.predict(obs, deterministic=True)
    if precision == "fp32":
        np.testing.assert_allclose(actions, expected, rtol=0, atol=2e-5 * 2.0)
    else:
        reference = compile_policy(model, precision, use_kernels=False)
        _, bound = error_bound(model, reference, obs)
        assert np.all(np.abs(actions - expected) <= bound + 2e-5)
    assert counts.min() > 0
    sizes = cortex_m.policy_object_sizes(export.folder, tmp_path / "obj", export.name)
    assert export.weight_bytes <= sizes["flash"] < export.weight_bytes + 8192
    if precision != "fp32":  # the compressed 3-256-256-1 actor fits a 16 KB flash budget
        assert sizes["flash"] <= 16 * 1024, sizes


@needs_tools
def test_an_actor_with_input_scaling_acts_on_the_m4_as_the_runtime_does(pendulum_actor, tmp_path):
    from rlq.deploy import SAME_CODES_RTOL, compile_policy, error_bound, write_c
    from rlq.deploy.input_scaling import INPUT_SCALING

    model, obs = pendulum_actor
    export = write_c(model, tmp_path / "c", precision="int8", calibration=obs)
    assert export.ops[0]["name"] == INPUT_SCALING
    actions, _ = cortex_m.run_qemu(
        cortex_m.build_cortex_m(export.folder, export.name, obs, tmp_path / "build")
    )
    reference = compile_policy(model, "int8", calibration=obs, use_kernels=False)
    _, bound = error_bound(model, reference, obs)
    expected, _ = model.predict(obs, deterministic=True)
    assert np.all(np.abs(actions - expected) <= bound + 2e-5)
    # the same codes as the runtime's (tanh and the sums' order aside)
    np.testing.assert_allclose(actions, reference(obs), rtol=0, atol=SAME_CODES_RTOL * 2.0)
