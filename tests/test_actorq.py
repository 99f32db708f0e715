"""ActorQ: config validation, broadcast format, inference engines, local and Ray training, restart, resume."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlq.actorq import (
    BREAKDOWN_KEYS,
    ActorQConfig,
    ActorQConfigError,
    PolicyArchitecture,
    PolicyNet,
    decode_policy,
    encode_policy,
    make_engine,
    train,
)
from rlq.actorq.broadcast import QuantizedWeight, quantize_weight
from rlq.actorq.inference import engine_backends

TINY = dict(
    env_id="Pendulum-v1",
    n_actors=2,
    hidden_sizes=(32, 32),
    batch_size=32,
    learner_steps=60,
    learning_starts=200,
    samples_per_insert=8.0,
    update_period=20,
    eval_every=30,
    eval_episodes=1,
    torch_threads=1,
    max_insert_lead=200,
)


def tiny(**overrides) -> ActorQConfig:
    return ActorQConfig(**{**TINY, **overrides})


def arch(hidden=(256, 256), stochastic=False) -> PolicyArchitecture:
    return PolicyArchitecture(5, 2, hidden, "relu", stochastic, (-1.0, -2.0), (1.0, 2.0))


def weights_of(architecture: PolicyArchitecture) -> dict[str, np.ndarray]:
    net = PolicyNet(architecture)
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


# --- configuration -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("n_actors", 0, "n_actors"),
        ("actor_precision", "int33", "unknown precision"),
        ("comm_precision", "fp8", "unknown precision"),
        ("algorithm", "PPO", "TD3, DDPG, SAC"),
        ("backend", "mpi", "local, ray"),
        ("actor_backend", "tensorrt", "auto, torch, onnx"),
        ("update_period", 0, "update_period"),
        ("hidden_sizes", (), "hidden_sizes"),
        ("samples_per_insert", -1.0, "positive"),
    ],
)
def test_bad_config_fails_at_construction(field, value, message):
    with pytest.raises(ActorQConfigError, match=message):
        ActorQConfig(**{field: value})


def test_bad_env_fails_before_anything_starts(tmp_path):
    ray = pytest.importorskip("ray")
    started = ray.is_initialized()
    with pytest.raises(ActorQConfigError, match="unknown environment id"):
        train(
            tiny(env_id="dm_control/cartpole-balanse-v0", backend="ray", checkpoint_dir=str(tmp_path / "c"))
        )
    with pytest.raises(ActorQConfigError, match="continuous"):
        train(tiny(env_id="CartPole-v1"))
    assert ray.is_initialized() == started and not (tmp_path / "c").exists()


def test_config_fields_are_documented():
    import dataclasses
    import inspect

    source = inspect.getsource(ActorQConfig)
    for f in dataclasses.fields(ActorQConfig):
        line = source.split(f"    {f.name}:")[1].splitlines()[1].strip()
        assert line.startswith('"""') and len(line) > 10, f"{f.name} needs a one-line docstring"


# --- broadcast and engines -----------------------------------------------------------------------------


def test_broadcast_sizes_and_roundtrip():
    w = weights_of(arch())
    sizes = {p: len(encode_policy(w, p, version=7)) for p in ("fp32", "fp16", "int8", "int4")}
    assert sizes["int8"] <= 0.27 * sizes["fp32"]
    assert sizes["fp16"] <= 0.51 * sizes["fp32"] and sizes["int4"] < 0.6 * sizes["int8"]
    for precision in ("fp32", "fp16", "bf16", "int8", "int4"):
        decoded = decode_policy(encode_policy(w, precision, version=7))
        assert decoded.version == 7 and list(decoded.weights) == list(w)
        back = decoded.float_weights()
        for name, value in w.items():
            step = np.abs(value).max() / (7 if precision == "int4" else 127)
            tol = {"fp32": 0, "fp16": 1e-3, "bf16": 1e-2}.get(precision, step)
            assert np.abs(back[name] - value).max() <= tol + 1e-7, (precision, name)
    int8 = decode_policy(encode_policy(w, "int8"))
    assert isinstance(int8.weights["layers.0.weight"], QuantizedWeight)
    assert int8.weights["layers.0.weight"].codes.dtype == np.int8
    with pytest.raises(ValueError, match="magic"):
        decode_policy(b"not a policy at all")


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_broadcast_refuses_non_finite_weights_naming_them(precision):
    """A NaN made its row's scale NaN and every code of that row garbage, sent to every actor."""
    w = weights_of(arch((16, 16)))
    w["layers.1.weight"][2, 3] = np.nan
    with pytest.raises(ValueError, match="weight 'layers.1.weight': it holds 1 NaN and 0 inf among its 256"):
        encode_policy(w, precision)
    with pytest.raises(ValueError, match="weight 'mu': it holds 1 NaN"):
        quantize_weight(w["layers.1.weight"], 8, name="mu")
    # float broadcasts cast each value on its own, as ptq's fp16 does: the NaN arrives as the one NaN it was
    assert np.isnan(decode_policy(encode_policy(w, "fp16")).float_weights()["layers.1.weight"]).sum() == 1


@pytest.mark.parametrize("stochastic", [False, True], ids=["td3", "sac"])
def test_engines_agree_with_fp32(stochastic):
    architecture = arch((64, 64), stochastic)
    w = weights_of(architecture)
    obs = np.random.default_rng(0).standard_normal((16, 5)).astype(np.float32)
    reference = make_engine(architecture, "fp32", "torch")
    reference.load(decode_policy(encode_policy(w, "fp32")))
    expected = reference(obs)
    for precision, backend, comm, tol in [
        ("fp32", "onnx", "fp32", 1e-5),
        ("fp16", "torch", "fp16", 2e-2),
        ("int8", "torch", "fp32", 5e-2),
        ("int8", "onnx", "int8", 5e-2),
        ("int8", "onnx", "fp16", 5e-2),
        ("int4", "torch", "int4", 0.3),
    ]:
        engine = make_engine(architecture, precision, backend)
        engine.load(decode_policy(encode_policy(w, comm)))
        got = engine(obs)
        assert len(got) == len(expected) == (2 if stochastic else 1)
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape and np.abs(g - e).max() < tol, (precision, backend, comm)


# --- local backend -------------------------------------------------------------------------------------


def test_local_end_to_end_breakdown_and_determinism():
    first = train(tiny(actor_precision="int8", actor_backend="auto"))
    assert first.learner_steps == 60 and first.env_steps >= 200 + 60 * 32 / 8
    assert list(first.history["learner_steps"]) == [0, 30, 60]
    assert first.history["wall_time_s"].is_monotonic_increasing
    assert set(first.breakdown) == set(BREAKDOWN_KEYS)
    total = sum(first.breakdown.values())
    assert total == pytest.approx(first.elapsed_s, rel=0.02)
    assert first.breakdown["driver_other"] < 0.1 * first.elapsed_s  # the timers cover the time
    for key in ("actor_env_step", "actor_inference", "actor_load", "learner_update", "broadcast"):
        assert first.breakdown[key] > 0, key
    assert first.actor_backend in ("onnx-int8", "torch-int8", "compiled-int8")
    assert set(first.backend_timings) == set(
        engine_backends("int8")
    )  # compiled too where its kernels are built
    assert first.bytes_per_broadcast > 0 and first.broadcasts >= 61 and first.actor_steps_per_s > 0
    assert len(first.episodes) >= 1 and first.model is not None
    assert list(first.per_actor["actor_id"]) == [0, 1] and (first.per_actor["env_steps"] > 0).all()
    assert first.per_actor["env_steps"].sum() == first.env_steps and first.actor_restarts == 0
    assert first.per_actor["episodes"].sum() == len(first.episodes)
    again = train(tiny(actor_precision="int8", actor_backend=first.actor_backend.split("-")[0]))
    np.testing.assert_allclose(again.history["eval_return"], first.history["eval_return"])
    assert again.env_steps == first.env_steps


@pytest.mark.parametrize("algorithm", ["SAC"])
def test_local_other_algorithms(algorithm):
    result = train(tiny(algorithm=algorithm, learner_steps=10, eval_every=0, actor_backend="onnx"))
    assert result.learner_steps == 10 and len(result.history) == 2
    assert result.model.__class__.__name__ == algorithm


def test_int8_broadcast_is_a_quarter_of_fp32():
    sizes = {}
    for precision in ("fp32", "int8"):
        result = train(
            tiny(actor_precision=precision, actor_backend="torch", hidden_sizes=(256, 256), learner_steps=2,
                 eval_every=0, n_actors=1)
        )  # fmt: skip
        sizes[precision] = result.bytes_per_broadcast
    assert sizes["int8"] <= 0.27 * sizes["fp32"]


def test_checkpoint_interrupt_and_resume(tmp_path):
    config = tiny(
        checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=30, learner_steps=90, actor_backend="torch"
    )

    def interrupt(progress):
        if progress.learner_steps >= 40:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, callback=interrupt)
    assert (tmp_path / "ckpt" / "state.json").is_file() and (tmp_path / "ckpt" / "learner_30.zip").is_file()
    resumed = train(config)
    assert resumed.resumed_from == 30 and resumed.learner_steps == 90
    assert list(resumed.history["learner_steps"]) == [0, 30, 60, 90]
    assert resumed.history["wall_time_s"].is_monotonic_increasing
    assert resumed.model.replay_buffer.size() == resumed.env_steps
    with pytest.raises(ActorQConfigError, match="another configuration"):
        train(tiny(checkpoint_dir=str(tmp_path / "ckpt"), hidden_sizes=(16,)))


def test_a_resumed_auto_run_keeps_the_engine_it_trained_with(tmp_path, monkeypatch):
    """The engine ``auto`` measured at the start and the broadcast's size are stored; resuming (a finished run
    too) does not measure again."""
    import json

    from rlq.actorq import driver
    from rlq.actorq.inference import engine_label

    config = tiny(checkpoint_dir=str(tmp_path / "ckpt"), learner_steps=30, actor_backend="auto")
    first = train(config)
    state_file = tmp_path / "ckpt" / "state.json"
    state = json.loads(state_file.read_text())
    assert engine_label(state["actor_backend"], config.actor_precision) == first.actor_backend
    other = "compiled" if state["actor_backend"] == "torch" else "torch"
    monkeypatch.setattr(driver, "choose_backend", lambda *args, **kwargs: (other, {}))
    again = train(config)
    assert again.resumed_from == 30 and again.actor_backend == first.actor_backend
    assert again.backend_timings == first.backend_timings
    assert (
        again.bytes_per_broadcast == first.bytes_per_broadcast > 0
    )  # a finished run broadcasts nothing anew
    del state["actor_backend"]  # a checkpoint written before engines were stored: measured anew
    state_file.write_text(json.dumps(state))
    assert train(config).actor_backend == engine_label(other, config.actor_precision)


def test_callback_stops_early_and_checkpoints(tmp_path):
    config = tiny(checkpoint_dir=str(tmp_path), learner_steps=1000, actor_backend="torch")
    result = train(config, callback=lambda p: p.learner_steps < 10)
    assert 10 <= result.learner_steps < 1000 and result.checkpoint is not None and result.checkpoint.exists()


# --- Ray backend ---------------------------------------------------------------------------------------


def _ray_children() -> list:
    import psutil

    found = []
    for p in psutil.Process().children(recursive=True):
        try:  # a zombie has exited and waits only to be reaped; psutil refuses its command line
            if p.status() != psutil.STATUS_ZOMBIE and "ray" in " ".join(p.cmdline()).lower():
                found.append(p)
        except psutil.Error:  # exited meanwhile
            pass
    return found


@pytest.mark.slow
def test_ray_started_by_train_is_shut_down_on_interrupt():
    """Runs before the module's Ray fixture: train() starts its own Ray and must leave nothing of it."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    handles = []

    def interrupt(progress):
        handles.extend(progress.actors)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny(backend="ray", ray_num_cpus=2, actor_backend="onnx", n_actors=1), callback=interrupt)
    assert handles and not ray.is_initialized()
    deadline = time.time() + 20
    while _ray_children() and time.time() < deadline:
        time.sleep(0.5)
    assert not _ray_children(), "Ray processes left behind"


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance for every Ray test of this module; nothing of it is left afterwards."""
    ray = pytest.importorskip("ray")
    from rlq.actorq.actor_runtimes import ray_init_kwargs

    assert not ray.is_initialized()
    ray.init(**ray_init_kwargs(num_cpus=2))
    yield ray
    ray.shutdown()
    deadline = time.time() + 20
    while _ray_children() and time.time() < deadline:
        time.sleep(0.5)
    assert not _ray_children(), "Ray processes left behind"


def kill_and_await_restart(ray, handle) -> tuple[int, int | None]:
    """Return the old and new process ids of a Ray actor killed here and brought back by Ray (None: not back)."""
    old = ray.get(handle.ping.remote())
    ray.kill(handle, no_restart=False)
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until Ray has brought it back in a new process
        try:
            pid = ray.get(handle.ping.remote(), timeout=10)
            if pid != old:
                return old, pid
        except ray.exceptions.RayActorError:
            pass
        time.sleep(0.2)
    return old, None


@pytest.mark.slow
def test_ray_end_to_end_with_actor_restart(ray_session):
    ray = ray_session
    pids: list[tuple[int, int | None]] = []
    handles = []

    def kill_one(progress):
        if progress.learner_steps >= 20 and not pids:
            handles.append(progress.actors[0])
            pids.append(kill_and_await_restart(ray, progress.actors[0]))

    config = tiny(backend="ray", actor_backend="onnx", learner_steps=100, eval_every=50, max_actor_restarts=2)
    result = train(config, callback=kill_one)
    assert pids and pids[0][1] not in (None, pids[0][0])
    handle = handles[0]
    assert result.learner_steps == 100 and result.actor_restarts >= 1 and result.actors_lost == 0
    assert list(result.history["learner_steps"]) == [0, 50, 100]
    assert set(result.breakdown) == set(BREAKDOWN_KEYS) and result.breakdown["actor_pull"] > 0
    assert ray.is_initialized()  # a Ray instance train() did not start is left running, its actors are not
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(handle.ping.remote(), timeout=30)


@pytest.mark.slow
def test_ray_counts_every_actor_death_once_and_reports_each_actors_share(ray_session):
    """An actor killed early is counted once, though the loop and Ray's records both know of it; one killed at the
    run's last step, after which the loop hears from no actor, used to go uncounted (its death was noticed only
    at the next chunk from it); each actor's share of the experience is reported beside its restarts."""
    ray = ray_session
    pids: list[tuple[int, int | None]] = []

    def kill(progress):
        if progress.learner_steps >= 10 and not pids:
            pids.append(kill_and_await_restart(ray, progress.actors[0]))
        elif progress.learner_steps == config.learner_steps and len(pids) == 1:
            pids.append(kill_and_await_restart(ray, progress.actors[1]))

    config = tiny(backend="ray", actor_backend="onnx", learner_steps=40, eval_every=0, max_actor_restarts=2)
    result = train(config, callback=kill)
    assert len(pids) == 2 and all(new not in (None, old) for old, new in pids)
    assert result.learner_steps == 40 and result.actor_restarts == 2 and result.actors_lost == 0
    per_actor = result.per_actor
    assert list(per_actor["actor_id"]) == [0, 1] and list(per_actor["restarts"]) == [1, 1]
    assert not per_actor["lost"].any() and (per_actor["env_steps"] > 0).all()
    assert per_actor["env_steps"].sum() == result.env_steps
    assert per_actor["env_step_share"].sum() == pytest.approx(1.0)
    assert per_actor["episodes"].sum() == len(result.episodes)


def test_torch_int8_engine_acts_with_the_broadcast_codes_on_every_load():
    architecture = arch((64, 64))
    engine = make_engine(architecture, "int8", "torch")
    obs = np.random.default_rng(1).standard_normal((8, 5)).astype(np.float32)
    for seed in (0, 1):  # the first load builds the int8 layers, the second only sets new codes into them
        w = {k: v + 0.05 * seed for k, v in weights_of(architecture).items()}
        policy = decode_policy(encode_policy(w, "int8", version=seed))
        engine.load(policy)
        layers = {
            n: m for n, m in engine.model.named_modules() if hasattr(m, "weight") and callable(m.weight)
        }
        assert len(layers) == 3
        for name, layer in layers.items():
            sent = policy.weights[f"{name}.weight"]
            assert np.array_equal(layer.weight().int_repr().numpy(), sent.codes)
            assert np.allclose(layer.weight().q_per_channel_scales().numpy(), sent.scale)
        # a float network holding exactly the decoded weights acts the same, up to activation rounding
        reference = make_engine(architecture, "fp32", "torch")
        reference.load(policy)
        assert np.abs(engine(obs)[0] - reference(obs)[0]).max() < 5e-2


def test_torch_fp16_engine_takes_each_new_policy():
    architecture = arch((64, 64))
    engine = make_engine(architecture, "fp16", "torch")
    obs = np.random.default_rng(2).standard_normal((8, 5)).astype(np.float32)
    for seed in (0, 1, 2):  # later loads copy into the fp16 network built at the first one
        w = {k: v * (1 + 0.5 * seed) for k, v in weights_of(architecture).items()}
        reference = make_engine(architecture, "fp32", "torch")
        reference.load(decode_policy(encode_policy(w, "fp32")))
        engine.load(decode_policy(encode_policy(w, "fp16", version=seed)))
        assert np.abs(engine(obs)[0] - reference(obs)[0]).max() < 2e-2


def test_the_learner_starts_in_tanhs_linear_range_and_records_saturation():
    """Acme's guards against a saturated policy: a near-zero output layer (actor and target), lr 1e-4,
    noise 0.3 and gradient clipping at 40 by default; the history shows the policy's pre-tanh scale."""
    import torch

    from rlq.actorq.learner import Learner, policy_saturation

    config = tiny(algorithm="D4PG")
    assert (config.learning_rate, config.exploration_noise, config.max_grad_norm) == (1e-4, 0.3, 40.0)
    model = Learner.create(config).model
    last = model.actor.mu[-2]
    sigma = (1e-4 / last.in_features) ** 0.5  # truncated at 2 sigma: its std is 0.88 sigma
    assert float(last.weight.abs().max()) <= 2 * sigma and 0.5 * sigma < float(last.weight.std()) < sigma
    assert float(last.bias.abs().max()) == 0.0 and model.max_grad_norm == 40.0
    for a, b in zip(model.actor.parameters(), model.actor_target.parameters(), strict=True):
        assert torch.equal(a, b)
    obs = np.stack([model.observation_space.sample() for _ in range(64)])
    pre_tanh, saturated = policy_saturation(model, obs)
    assert pre_tanh < 0.01 and saturated == 0.0
    with torch.no_grad():
        last.weight.mul_(1e4)  # what a few updates at lr 1e-3 did to PyTorch's default initialisation
    pre_tanh, saturated = policy_saturation(model, obs)
    assert pre_tanh > 5 and saturated > 0.5
    default = Learner.create(tiny(algorithm="D4PG", policy_output_init=0.0)).model.actor.mu[-2]
    assert float(default.weight.std()) > 10 * float(last.weight.std()) / 1e4
    history = train(tiny(algorithm="D4PG", learner_steps=30)).history
    later = history.iloc[1:]  # the first evaluation comes before any transition is in the buffer (NaN)
    assert later["actor_saturated_share"].notna().all() and (later["actor_mean_abs_pre_tanh"] < 1).all()


def test_d4pg_clips_each_networks_gradient_norm():
    import torch

    from rlq.actorq.learner import Learner

    model = Learner.create(tiny(algorithm="D4PG", max_grad_norm=1e-3)).model
    loss = sum(p.square().sum() for p in model.critic.parameters()) * 1e3
    loss.backward()
    model._clip(model.critic)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.critic.parameters()]))
    assert float(norm) == pytest.approx(1e-3, rel=1e-3)
    with pytest.raises(ActorQConfigError, match="max_grad_norm"):
        tiny(max_grad_norm=-1.0)
