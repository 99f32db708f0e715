"""GST and gradual-pruning callbacks inside SB3 training: every algorithm, targets, optimizers, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3 import SAC, TD3
from torch.nn.utils import parametrize

from rlq.compress import (
    GSTConfig,
    block_size_of,
    circulant_vectors,
    gradual_sparsity,
    is_block_circulant,
    layer_report,
    sparsity_of,
)
from rlq.compress.block_circulant import stored_target
from rlq.compress.circulant import is_block_circulant_matrix
from rlq.compress.masks import mask_of, stored_tensor
from rlq.compress.optimizer_state import SECOND_MOMENT_KEYS
from rlq.rl.agents import make_model
from rlq.sb3.checkpoint import (
    CompressedCheckpoints,
    dense_state_dict,
    load_compressed,
    load_dense_actor,
    save_compressed,
    save_dense_actor,
    saved_callback_states,
)
from rlq.sb3.compression import CompressionCallback
from rlq.sb3.compression_history import HISTORY_COLUMNS
from rlq.sb3.gst_callback import GSTCallback
from rlq.sb3.networks import optimizers, policy_layers
from rlq.sb3.pruning_callback import GradualPruningCallback

ALGORITHMS = ("TD3", "SAC", "DDPG", "A2C", "PPO", "DQN")
#: rewards never count as a drop: the reward-aware target rises at every update (deterministic tests)
ALWAYS_HOLDS = {"window": 1, "step_size": 0.1, "max_sparsity": 0.9, "abs_tolerance": 1e9}


class ScriptedGST(GSTCallback):
    """GST fed one scripted score ``trace(step)`` per step instead of Monitor's episode returns."""

    def __init__(self, trace=lambda step: 1.0, **kwargs):
        super().__init__(**kwargs)
        self.trace = trace

    def _scores(self) -> list[float]:
        return [self.trace(self.num_timesteps)]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one PyTorch thread per test


def tiny(algo: str) -> tuple[str, dict]:
    """Return an env id and hyperparameters that make ``algo`` train fast with a [16, 16] network."""
    hyper: dict = {"policy_kwargs": {"net_arch": [16, 16]}}
    if algo in ("TD3", "SAC", "DDPG", "DQN"):
        hyper |= {"learning_starts": 40, "buffer_size": 1000, "batch_size": 16}
    if algo == "DQN":
        hyper |= {"target_update_interval": 10, "train_freq": 2, "gradient_steps": 1}
    if algo in ("A2C", "PPO"):
        hyper |= {"n_steps": 16}
    if algo == "PPO":
        hyper |= {"batch_size": 16, "n_epochs": 2}
    return ("CartPole-v1" if algo in ("A2C", "PPO", "DQN") else "Pendulum-v1"), hyper


def gst_settings(total: int = 400, **overrides) -> dict:
    base = dict(
        total_steps=total,
        block_schedule=((0.0, 4), (0.25, 2)),
        transition_method="exact",
        bc_end=0.5,
        s_shift=0.5,
        prune_every=20,
        sparsity=ALWAYS_HOLDS,
    )
    return base | overrides


def twins(model, callback):
    layers = callback.layers
    return [(name, layers.online[name], layers.targets.get(name)) for name in layers.eligible]


def assert_targets_mirror_online(model, callback):
    for name, online, target in twins(model, callback):
        if target is None:
            continue
        assert block_size_of(online) == block_size_of(target), name
        online_mask = mask_of(*stored_target(online))
        target_mask = mask_of(*stored_target(target))
        assert (online_mask is None) == (target_mask is None), name
        if online_mask is not None:
            assert torch.equal(online_mask, target_mask), f"{name}: target mask differs from online"


def assert_optimizers_hold_live_parameters(model):
    live = {id(p): p for p in model.policy.parameters()}
    for optimizer in optimizers(model.policy):
        for group in optimizer.param_groups:
            for p in group["params"]:
                assert id(p) in live
                for value in optimizer.state.get(p, {}).values():
                    if torch.is_tensor(value) and value.dim() > 0:
                        assert value.shape == p.shape


def assert_masked_state_parked(model, callback):
    """Masked entries' optimizer state is parked: first moments 0, second moments positive (not 0)."""
    checked = 0
    for name, online, _ in twins(model, callback):
        mask = mask_of(*stored_target(online))
        if mask is None:
            continue
        param = stored_tensor(*stored_target(online))
        state = next((opt.state[param] for opt in optimizers(model.policy) if opt.state.get(param)), None)
        if state is None:
            continue
        masked = mask == 0
        for key, value in state.items():
            if torch.is_tensor(value) and value.shape == param.shape:
                if key in SECOND_MOMENT_KEYS:
                    assert (value[masked] > 0).all(), f"{name}: {key} of masked entries reached 0"
                else:
                    assert (value[masked] == 0).all(), f"{name}: {key} of masked entries is not 0"
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_gst_through_training_of_every_algorithm(algo):
    env_id, hyper = tiny(algo)
    model = make_model(algo, env_id, seed=0, hyperparams=hyper)
    transition = "projection" if algo == "SAC" else "exact"  # SAC's trunk feeds two heads
    callback = ScriptedGST(**gst_settings(transition_method=transition), log_every=25, reward_window=3)

    model.learn(90, callback=callback)  # block-circulant phase, B=4
    assert callback.covered_fraction > 0.5
    vectors = {}
    for name, online, target in twins(model, callback):
        for layer in (online, target) if target is not None else (online,):
            assert is_block_circulant(layer) and block_size_of(layer) == 4, name
            assert is_block_circulant_matrix(layer.weight.detach(), 4)
        vectors[name] = circulant_vectors(online).detach().clone()
    assert_optimizers_hold_live_parameters(model)

    model.learn(310, callback=callback, reset_num_timesteps=False)  # transition, pruning, hand-over
    assert not parametrize._cache_enabled  # an on-policy rollout's weight cache is closed after learn()
    for name, online, target in twins(model, callback):
        assert not is_block_circulant(online) and sparsity_of(online) == pytest.approx(0.9, abs=0.02), name
        for layer in (online, target) if target is not None else (online,):
            values, mask = stored_target(layer)[0].weight_orig, stored_target(layer)[0].weight_mask
            assert torch.all(layer.weight[mask == 0] == 0), f"{name}: a pruned weight is not zero"
            assert torch.all((values * mask)[mask == 0] == 0)
    assert_targets_mirror_online(model, callback)
    assert_optimizers_hold_live_parameters(model)
    assert_masked_state_parked(model, callback)

    history = callback.history
    assert list(history.columns) == HISTORY_COLUMNS
    assert history["step"].iloc[0] == 0 and history["compression_ratio"].iloc[0] > 0.5  # from step 0
    assert history["target_sparsity"].is_monotonic_increasing and history["target_sparsity"].iloc[-1] == 0.9
    assert set(history["phase"]) == {"block_circulant", "block_circulant+pruning", "pruning"}
    kinds = callback.events["kind"].tolist()
    assert kinds[:2] == ["block_circulant", "transition"] and "hand_over" in kinds
    shift = callback.events.loc[1, "mean_shift"]
    assert shift == 0.0 if transition == "exact" else shift > 0.0
    assert 0.5 < callback.average_compression_ratio() < 1.0
    assert callback.compression_ratio() == pytest.approx(history["compression_ratio"].iloc[-1])
    # the reward is the mean of the last episodes' returns, as Monitor reported them
    returns = [float(info["r"]) for info in model.ep_info_buffer][-3:]
    assert callback.episodes >= 1 and list(callback.returns) == pytest.approx(returns)


@pytest.mark.parametrize("algo", ["TD3", "PPO"])
def test_training_moves_the_block_circulant_vectors_and_polyak_averages_the_targets(algo):
    env_id, hyper = tiny(algo)
    if algo == "TD3":
        hyper |= {"policy_delay": 1}  # a polyak update after every gradient step
    model = make_model(algo, env_id, seed=0, hyperparams=hyper)
    callback = GSTCallback(**gst_settings(total=10_000))
    model.learn(64, callback=callback)
    name, online, target = twins(model, callback)[0]
    before = circulant_vectors(online).detach().clone()
    model.learn(64, callback=callback, reset_num_timesteps=False)
    after = circulant_vectors(online).detach()
    # the optimizer still trains the B-vectors (PPO: rollouts ran under a weight cache, training did not)
    assert not torch.equal(before, after)
    assert not parametrize._cache_enabled
    if target is not None:  # polyak: target <- (1 - tau) target + tau online, on the B-vectors themselves
        target_before = circulant_vectors(target).detach().clone()
        online_before = circulant_vectors(online).detach().clone()
        model.learn(1, callback=callback, reset_num_timesteps=False)
        tau = model.tau
        expected = (1 - tau) * target_before + tau * circulant_vectors(online).detach()
        torch.testing.assert_close(circulant_vectors(target).detach(), expected)
        assert not torch.equal(online_before, circulant_vectors(online).detach())


def test_compression_ratio_matches_hand_count():
    env_id, hyper = tiny("TD3")  # Pendulum: 3 observations, 1 action
    model = make_model("TD3", env_id, seed=0, hyperparams=hyper)
    callback = ScriptedGST(**gst_settings(total=1000, s_shift=0.1, prune_every=10))
    model.learn(45, callback=callback)  # B=4, no pruning yet (rise at 50)
    # actor 3-16-16-1, two critics (3+1)-16-16-1; only the 16x16 layers are compressed
    dense = (3 * 16 + 256 + 16) + 2 * (4 * 16 + 256 + 16)
    assert callback.compression_ratio() == pytest.approx(1 - (dense - 3 * (256 - 256 // 4)) / dense)
    model.learn(60, callback=callback, reset_num_timesteps=False)  # compression 0.85, 0.95...
    schedule = callback.schedule
    s = schedule.stored_sparsity(schedule.applied_sparsity, 4)  # of the B-vectors
    assert s > 0 and 1 - (1 - s) / 4 == pytest.approx(schedule.applied_sparsity)
    kept = sum(int(mask_of(*stored_target(layer)).sum()) for _, layer, _ in twins(model, callback))
    assert kept == 3 * (64 - round(64 * s))
    assert callback.compression_ratio() == pytest.approx(1 - (dense - 3 * 256 + kept) / dense)
    report = callback.layer_report()
    assert report["eligible"].sum() == 3 and report["has_target"].sum() == 9
    # the ratio over the whole policy, targets included, is the same number
    rows = layer_report(model.policy)
    assert 1 - sum(r["stored"] for r in rows) / sum(r["dense"] for r in rows) == pytest.approx(
        callback.compression_ratio()
    )


def test_reward_aware_target_rises_while_reward_holds_and_backs_off_when_it_drops():
    env_id, hyper = tiny("DQN")
    model = make_model("DQN", env_id, seed=0, hyperparams=hyper)

    def trace(step):  # rising, a drop from step 100 to 160, then above the earlier best
        return 10 + step / 10 if step < 100 else 0.0 if step < 160 else 100.0

    sparsity = {"window": 1, "min_episodes": 1, "step_size": 0.02, "backoff": 0.02, "tolerance": 0.0,
                "max_sparsity": 0.98}  # fmt: skip
    callback = ScriptedGST(trace, **gst_settings(total=4000, s_shift=0.0, bc_end=1.0, sparsity=sparsity))
    model.learn(240, callback=callback)
    history = callback.history.set_index("step")
    decisions, targets = history["decision"], history["target_sparsity"]
    # pruning begins at learning_starts (40) from B = 4's 75% compression and rises while the reward holds
    assert decisions.loc[0:80].eq("rise").all() and targets.loc[0] == pytest.approx(0.77)
    # the drop backs off the rise before it, then holds at the target before that rise while it lasts
    assert decisions.loc[100] == "backoff" and decisions.loc[120:140].eq("hold").all()
    assert targets.loc[100:140].max() < targets.loc[80] and targets.loc[100] == pytest.approx(
        targets.loc[80] - 0.02
    )
    assert decisions.loc[160] == "rise" and targets.iloc[-1] > targets.loc[160]  # recovered: rises again
    assert (history["compression_ratio"] <= callback.covered_fraction * 0.98 + 1e-9).all()


def test_gradual_pruning_follows_zhu_and_gupta():
    env_id, hyper = tiny("DQN")
    model = make_model("DQN", env_id, seed=0, hyperparams=hyper)
    callback = GradualPruningCallback(
        0.8, start_fraction=0.25, end_fraction=0.75, update_every=20, log_every=10
    )
    model.learn(400, callback=callback)
    history = callback.history
    # fractions are of the training updates [learning_starts=40, 400): t0 = 40 + 0.25 * 360, t1 = 40 + 0.75 * 360
    t0, t1 = 130, 310
    assert (callback.start, callback.end) == (t0, t1)
    before = history[history["step"] < t0]
    assert (before["compression_ratio"] == 0).all() and (before["phase"] == "dense").all()
    prunes = history[history["event"] == "prune"]
    expected = [gradual_sparsity(int(s), 0.8, t0, t1, update_every=20) for s in prunes["step"]]
    assert prunes["sparsity"].tolist() == pytest.approx(expected)
    assert prunes["sparsity"].is_monotonic_increasing and prunes["sparsity"].iloc[-1] == pytest.approx(0.8)
    for _, online, _ in twins(model, callback):
        assert sparsity_of(online) == pytest.approx(0.8, abs=0.01)
    assert_targets_mirror_online(model, callback)
    assert_masked_state_parked(model, callback)
    # about 0.65 * s_f over the layers it prunes, between t0 and the end, by the history's steps
    covered = callback.covered_fraction
    assert callback.average_compression_ratio(start_step=0) == pytest.approx(
        covered * np.mean([gradual_sparsity(t, 0.8, t0, t1, update_every=20) for t in range(400)]), rel=0.05
    )


def test_gst_fractions_count_from_learning_starts():
    env_id, hyper = tiny("TD3")  # learning_starts 40
    model = make_model("TD3", env_id, seed=0, hyperparams=hyper)
    settings = gst_settings()
    del settings["total_steps"]  # taken from learn(): 400 steps, fractions over [40, 400)
    callback = GSTCallback(**settings, log_every=10)
    model.learn(400, callback=callback)
    assert callback.config.start_step == 40
    events = callback.events.set_index("kind")
    # block-circulant at the first step; B 4 -> 2 at 40 + 0.25 * 360; hand-over at 40 + 0.5 * 360
    assert events.loc["transition", "step"] == 130 and events.loc["hand_over", "step"] == 220
    assert callback.schedule.rise_step == 40 + round(0.5 * 0.5 * 360)  # s_shift * bc_end of the updates
    history = callback.history
    pruned = history[history["event"].str.contains("prune")]
    assert (
        len(pruned) and pruned["step"].min() >= 130 and (history.query("step < 130")["sparsity"] == 0).all()
    )


def test_masked_state_is_parked_again_after_a_transition_resets_the_optimizers():
    # B-vectors are pruned at step 200 (Pendulum's first episode ends there), the B 4 -> 2 transition at
    # 240 drops all optimizer state, and no pruning update follows before 290: only parking after the
    # reset keeps the masked entries' second moments off zero
    env_id, hyper = tiny("TD3")
    model = make_model("TD3", env_id, seed=0, hyperparams=hyper)
    settings = gst_settings(block_schedule=((0.0, 4), (0.6, 2)), bc_end=0.8, s_shift=0.0, prune_every=100)
    # the earlier rule and target: it prunes once the first episode has a return, and not at the transition
    settings |= {"target": "stored", "sparsity": ALWAYS_HOLDS | {"rule": "windowed"}}
    callback = GSTCallback(**settings, log_every=50)
    model.learn(290, callback=callback)
    steps = callback.events.set_index("kind")["step"]
    assert steps["prune"] < steps["transition"] and steps["transition"] + callback.park_every > 290
    assert_masked_state_parked(model, callback)


def test_dense_recorder_compresses_nothing():
    env_id, hyper = tiny("PPO")
    model = make_model("PPO", env_id, seed=0, hyperparams=hyper)
    callback = CompressionCallback(log_every=16)
    model.learn(64, callback=callback)
    assert callback.average_compression_ratio() == 0.0 and (callback.history["phase"] == "dense").all()
    assert callback.covered_fraction == pytest.approx(2 * 256 / (2 * (4 * 16 + 256) + 2 * 16 + 16))


def test_save_and_load_round_trip_keeps_compression_actions_and_schedule(tmp_path):
    env_id, hyper = tiny("TD3")
    model = make_model("TD3", env_id, seed=0, hyperparams=hyper)
    callback = ScriptedGST(**gst_settings(total=600, s_shift=0.3), log_every=25)
    model.learn(200, callback=callback)  # B=2 after an exact transition, B-vectors pruned
    assert callback.schedule.phase(model.num_timesteps) == "block_circulant+pruning"
    path = save_compressed(model, tmp_path / "gst", callbacks=[callback])
    assert path.name == "gst.zip" and saved_callback_states(path)["gst"]["extra"]["schedule"]["started"]
    obs = np.stack([model.observation_space.sample() for _ in range(16)])

    resumed_callback = ScriptedGST(**gst_settings(total=600, s_shift=0.3), log_every=25)
    loaded = load_compressed(TD3, path, env=model.get_env(), callbacks=[resumed_callback])
    for name, layer in policy_layers(model.policy).online.items():
        twin = policy_layers(loaded.policy).online[name]
        assert block_size_of(layer) == block_size_of(twin) == (2 if name.endswith(".2") else None)
    np.testing.assert_array_equal(
        model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0]
    )
    for a, b in zip(optimizers(model.policy), optimizers(loaded.policy), strict=True):
        sa, sb = a.state_dict()["state"], b.state_dict()["state"]
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)
    # plain SB3 loads the same file as a dense model computing the same actions
    plain = TD3.load(path)
    np.testing.assert_allclose(
        plain.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0], atol=1e-6
    )
    assert all(not is_block_circulant(m) for m in plain.policy.modules())
    assert set(dense_state_dict(model.policy)) == set(plain.policy.state_dict())

    assert resumed_callback.schedule.state_dict() == callback.schedule.state_dict()
    assert callback.schedule.applied_sparsity > 0
    loaded.learn(400, callback=resumed_callback, reset_num_timesteps=False)
    kinds = resumed_callback.events["kind"].tolist()
    assert kinds.count("block_circulant") == 1 and kinds.count("transition") == 1  # not repeated
    assert "hand_over" in kinds and resumed_callback.history["step"].is_monotonic_increasing
    assert len(resumed_callback.history) > len(callback.history)


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_compressed_checkpoint_round_trips_for_every_algorithm(algo, tmp_path):
    env_id, hyper = tiny(algo)
    model = make_model(algo, env_id, seed=0, hyperparams=hyper)
    callback = ScriptedGST(**gst_settings(total=200, transition_method="projection"))
    model.learn(120, callback=callback)  # block-circulant B=2 with pruned B-vectors
    path = save_compressed(model, tmp_path / "model.zip")
    cls = type(model)
    loaded, plain = load_compressed(cls, path, env=model.get_env()), cls.load(path)
    obs = np.stack([model.observation_space.sample() for _ in range(8)])
    expected = model.predict(obs, deterministic=True)[0]
    np.testing.assert_allclose(loaded.predict(obs, deterministic=True)[0], expected)
    np.testing.assert_allclose(plain.predict(obs, deterministic=True)[0], expected, atol=1e-5)
    for name, layer in policy_layers(model.policy).online.items():
        twin = policy_layers(loaded.policy).online[name]
        assert block_size_of(layer) == block_size_of(twin) and (mask_of(*stored_target(twin)) is None) == (
            mask_of(*stored_target(layer)) is None
        )
    loaded.learn(20, reset_num_timesteps=False)  # optimizer state fits the compressed parameters


def gst_run(folder, total, gst):
    """One GST training of TD3 as a notebook's per-run function trains it, into ``folder`` (resumed from it)."""
    env_id, hyper = tiny("TD3")
    callback = GSTCallback(**gst, log_every=25)
    checkpoints = CompressedCheckpoints(folder, every=100)
    model = checkpoints.resume(make_model("TD3", env_id, seed=0, hyperparams=hyper), [callback])
    model.learn(total - model.num_timesteps, callback=[callback, checkpoints], reset_num_timesteps=False)
    return model, callback, checkpoints


def test_interrupted_run_resumes_from_its_checkpoint(tmp_path):
    gst = gst_settings(total=400)
    _, first, checkpoints = gst_run(tmp_path, 200, gst)  # stops at 200 of the 400-step schedule
    assert checkpoints.resumed_from is None and (tmp_path / "checkpoints" / "model_200_steps.zip").exists()
    _, second, checkpoints = gst_run(tmp_path, 400, gst)
    assert checkpoints.resumed_from == 200
    assert second.history.iloc[: len(first.history)].equals(first.history)  # restored, not re-run
    kinds = second.events["kind"].tolist()
    assert kinds.count("block_circulant") == 1 and "hand_over" in kinds
    assert second.schedule.state_dict()["last_step"] >= 399
    _, third, checkpoints = gst_run(tmp_path, 400, gst)  # finished: loads, trains no further
    assert checkpoints.resumed_from == 400 and third.average_compression_ratio() == pytest.approx(
        second.average_compression_ratio()
    )
    with pytest.raises(ValueError, match="another configuration"):
        gst_run(tmp_path, 400, gst_settings(total=400, s_shift=0.9))


def test_a_run_saved_before_the_trend_guard_existed_resumes_with_the_guard_off(tmp_path):
    """States saved before trend_ratio / trend_window existed lack them: they resume at their defaults only."""
    import json

    gst_run(tmp_path, 200, gst_settings(total=300))
    path = tmp_path / "checkpoints" / "state_200_steps.json"
    state = json.loads(path.read_text())
    extra = state["callbacks"]["gst"]["extra"]
    for config in (extra["config"]["sparsity"], extra["schedule"]["controller"]["config"]):
        del config["trend_ratio"], config["trend_window"]  # what the older rlq wrote
    path.write_text(json.dumps(state))
    guarded = gst_settings(total=300)
    guarded["sparsity"] = {**guarded["sparsity"], "trend_ratio": 0.5}
    with pytest.raises(ValueError, match="another configuration"):
        gst_run(tmp_path, 300, guarded)
    model, _, checkpoints = gst_run(tmp_path, 300, gst_settings(total=300))
    assert checkpoints.resumed_from == 200 and model.num_timesteps == 300


def test_bad_input_is_rejected_with_clear_errors():
    with pytest.raises(ValueError, match="unknown GST setting"):
        GSTCallback(block_size=4)
    with pytest.raises(ValueError, match="block_schedule must start"):
        GSTCallback(block_schedule=((0.1, 4),))
    with pytest.raises(ValueError, match="either a GSTConfig or its fields"):
        GSTCallback(GSTConfig(total_steps=10), s_shift=0.5)
    with pytest.raises(ValueError, match="networks"):
        GSTCallback(networks="whole")
    with pytest.raises(ValueError, match="final_sparsity"):
        GradualPruningCallback(1.5)
    with pytest.raises(ValueError, match="start_fraction"):
        GradualPruningCallback(0.5, start_fraction=0.9, end_fraction=0.5)
    with pytest.raises(ValueError, match=r"unknown pruning setting\(s\) \['prune_every'\]"):
        GradualPruningCallback(0.5, prune_every=10)  # the callback's name for it is update_every
    with pytest.raises(ValueError, match="reward_window"):
        CompressionCallback(reward_window=0)
    with pytest.raises(RuntimeError, match="model.learn"):
        GSTCallback().compression_ratio()

    env_id, hyper = tiny("SAC")
    sac = make_model("SAC", env_id, seed=0, hyperparams=hyper)
    with pytest.raises(ValueError, match="non-overlapping chains"):  # SAC's trunk feeds mu and log_std
        sac.learn(10, callback=GSTCallback(**gst_settings(transition_method="exact")))
    assert isinstance(sac, SAC)
    shallow = make_model(
        "TD3", "Pendulum-v1", hyperparams={**tiny("TD3")[1], "policy_kwargs": {"net_arch": [16]}}
    )
    with pytest.raises(ValueError, match="no layer to compress"):
        shallow.learn(10, callback=GSTCallback(total_steps=100))
    with pytest.raises(ValueError, match="saved by"):
        GSTCallback().load_state_dict(CompressionCallback().state_dict())


@pytest.mark.parametrize("optimizer_reset", ["changed", "all"])
def test_structural_changes_keep_the_optimizer_state_of_untouched_layers(optimizer_reset):
    """The transition and the hand-over drop Adam's moments of what they change; the actor's dense output
    layer keeps counting every actor update since the first (the earlier rlq dropped them all)."""
    env_id, hyper = tiny("TD3")  # learning_starts 40, policy_delay 2
    model = make_model("TD3", env_id, seed=0, hyperparams=hyper)
    settings = gst_settings(total=400, transition_method="projection", optimizer_reset=optimizer_reset)
    callback = ScriptedGST(**settings)  # a transition at step 100, the hand-over at 200
    model.learn(400, callback=callback)
    assert {"transition", "hand_over"} <= set(callback.events["kind"])
    steps = {}
    for name, p in model.policy.named_parameters():
        state = model.actor.optimizer.state.get(p)
        if state:
            steps[name.replace("_orig", "")] = int(state["step"])
    actor_updates = (400 - 40) // 2
    # the hidden layer's weight is re-structured at the hand-over: its moments restart there
    assert steps["actor.mu.2.weight"] == (400 - 200) // 2 + 1
    untouched = [
        "actor.mu.0.weight",
        "actor.mu.0.bias",
        "actor.mu.2.bias",
        "actor.mu.4.weight",
        "actor.mu.4.bias",
    ]
    if optimizer_reset == "changed":
        assert [steps[name] for name in untouched] == [actor_updates] * len(untouched)
    else:
        assert max(steps.values()) == (400 - 200) // 2 + 1  # every state restarted at the hand-over
    assert_optimizers_hold_live_parameters(model)


def test_a_dense_actor_file_gives_a_new_agent_the_trained_actors_actions(tmp_path):
    env_id, hyper = tiny("TD3")
    model = make_model("TD3", env_id, seed=0, hyperparams=hyper)
    model.learn(
        400, callback=ScriptedGST(**gst_settings(total=400))
    )  # pruned after the block-circulant phase
    path = save_dense_actor(model, tmp_path / "actor.npz")
    with np.load(
        path
    ) as archive:  # the actor's dense-equivalent weights, as an independent computation gives them
        expected = {k: v.numpy() for k, v in dense_state_dict(model.policy.actor).items()}
        assert sorted(archive.files) == sorted(expected)
        for key, value in expected.items():
            np.testing.assert_array_equal(archive[key], value)
        assert (archive["mu.2.weight"] == 0).mean() > 0.3  # the pruned entries, stored as zeros
    fresh = make_model("TD3", env_id, seed=5, hyperparams=hyper)
    obs = np.stack([model.observation_space.sample() for _ in range(16)])
    assert not np.allclose(
        fresh.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0]
    )
    loaded = load_dense_actor(fresh, path)
    np.testing.assert_allclose(
        loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0], atol=1e-6
    )
    wider = make_model("TD3", env_id, seed=0, hyperparams={**hyper, "policy_kwargs": {"net_arch": [32, 16]}})
    with pytest.raises(ValueError, match="actor.npz: its weights do not fit"):
        load_dense_actor(wider, path)
