"""GSTSchedule (our design of the unpublished parts): decisions, and carrying them out during training."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from conftest import relu_mlp as mlp
from rlq.compress import (
    GSTConfig,
    GSTSchedule,
    RewardAwareConfig,
    average_compression_ratio,
    block_size_of,
    compression_ratio,
    covered_fraction,
    is_block_circulant,
    sparsity_of,
)
from rlq.compress.block_circulant import stored_target
from rlq.compress.circulant import is_block_circulant_matrix
from rlq.compress.gst import GSTHooks
from rlq.compress.masks import mask_of, prune_with_mask_
from rlq.compress.measures import stored_weight_count


def config(**overrides) -> GSTConfig:
    base = dict(
        total_steps=1000,
        block_schedule=((0.0, 4), (0.2, 2)),
        bc_end=0.5,
        s_shift=0.4,
        prune_every=50,
        sparsity=RewardAwareConfig(window=2, step_size=0.1, max_sparsity=0.9),
    )
    return GSTConfig(**{**base, **overrides})


def decisions(schedule: GSTSchedule, rewards=lambda step: 1.0, every: int = 10):
    return [
        (a.step, a.kind, a.block_size, None if a.sparsity is None else round(a.sparsity, 4))
        for step in range(0, schedule.config.total_steps, every)
        for a in schedule.step(step, [rewards(step)])
    ]


def test_timeline_of_actions_under_steady_reward():
    schedule = GSTSchedule(config())
    assert schedule.rise_step == 200 and schedule.handover_step == 500
    actions = decisions(schedule)
    assert actions[:2] == [(0, "block_circulant", 4, None), (200, "transition", 2, None)]
    prunes = [a for a in actions if a[1] == "prune"]
    # The target is each layer's compression: pruning begins at 200 from B = 2's 50% and rises by 0.1 per
    # update (5 new scores each, min_episodes 3) up to the 0.9 cap, which it never exceeds.
    assert prunes == [(200, "prune", None, 0.6), (250, "prune", None, 0.7), (300, "prune", None, 0.8),
                      (350, "prune", None, 0.9)]  # fmt: skip
    assert schedule.stored_sparsity(0.9, 2) == pytest.approx(0.8)  # of the B-vectors: 10% of the weights
    handover = next(a for a in actions if a[1] == "hand_over")
    # Vectors at sparsity 0.8 with B=2 store 10% of the weights: the kept-ratio hand-over keeps 0.9.
    assert handover == (500, "hand_over", 2, 0.9)
    assert schedule.phase(100) == "block_circulant"
    assert schedule.phase(300) == "block_circulant+pruning"
    assert schedule.phase(700) == "pruning"
    assert (
        schedule.block_size_at(100) == 4
        and schedule.block_size_at(300) == 2
        and schedule.block_size_at(600) is None
    )


def test_s_shift_moves_the_start_of_pruning_within_the_block_circulant_phase():
    assert GSTSchedule(config(s_shift=1.0)).rise_step == 500
    assert GSTSchedule(config(s_shift=0.25)).rise_step == 125
    assert GSTSchedule(config(s_shift=0.0)).rise_step == 0
    late = [a for a in decisions(GSTSchedule(config(s_shift=1.0))) if a[1] == "prune"]
    assert late[0][0] == 500 and late[0][3] == pytest.approx(0.6)  # from the hand-over's 0.5, one rise


def test_reward_drop_pauses_the_target():
    schedule = GSTSchedule(config())
    actions = decisions(schedule, rewards=lambda step: 1.0 if step < 400 else 0.2)
    prunes = [a[3] for a in actions if a[1] == "prune" and a[0] >= 400]
    # back-offs (0.05 each) undo the rise the drop followed (0.8 to 0.9), no more; the reward never returns,
    # so the target holds at 0.8
    assert prunes == pytest.approx([0.85, 0.8]) and schedule.controller.target == pytest.approx(0.8)
    assert schedule.controller.last_decision == "hold"


def test_schedule_resumes_from_its_state_dict():
    whole, first = GSTSchedule(config()), GSTSchedule(config())
    reward = lambda step: float(step % 7)  # noqa: E731
    for step in range(0, 400, 10):
        whole.step(step, [reward(step)])
        first.step(step, [reward(step)])
    resumed = GSTSchedule(config())
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    rest = range(400, 1000, 10)
    assert [whole.step(s, [reward(s)]) for s in rest] == [resumed.step(s, [reward(s)]) for s in rest]
    with pytest.raises(ValueError, match="go back"):
        resumed.step(10)


def train_with_schedule(schedule: GSTSchedule, net: nn.Module, every: int = 10):
    """A stand-in training loop: a few Adam steps between schedule calls, recording what GST did."""
    torch.manual_seed(1)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(16, 6)
    ratios, steps, events = [], [], {}
    for step in range(0, schedule.config.total_steps, every):
        for action in schedule.step(step, [1.0]):
            before = net(x).detach()
            schedule.execute_(net, action, [optimizer])
            events.setdefault(action.kind, []).append((step, (net(x).detach() - before).abs().max().item()))
        ratios.append(compression_ratio(net))
        steps.append(step)
        if schedule.phase(step) != "pruning":
            for layer in (net[2], net[4]):
                assert is_block_circulant_matrix(layer.weight.detach(), block_size_of(layer))
        optimizer.zero_grad()
        net(x).square().mean().backward()
        optimizer.step()
    return ratios, steps, events


@pytest.mark.parametrize("method", ["exact", "projection"])
def test_apply_runs_the_whole_schedule_on_a_network(method):
    torch.manual_seed(0)
    net = mlp()
    schedule = GSTSchedule(config(transition_method=method))
    ratios, steps, events = train_with_schedule(schedule, net)
    transition_step, transition_change = events["transition"][0]
    assert transition_step == 200
    if method == "exact":
        assert transition_change < 1e-5  # the function is kept through the exact transition
    assert not is_block_circulant(net[2]) and sparsity_of(net[2]) == pytest.approx(0.9, abs=0.01)
    assert sparsity_of(net[0]) == 0.0  # first and last layers stay dense
    # BC from step 0: 75% on the two hidden layers (512 of 96 + 256 + 256 + 48 = 656 weights).
    assert ratios[0] == pytest.approx(0.75 * 512 / 656)
    assert min(ratios) > 0.3 and ratios[-1] == pytest.approx(0.9 * 512 / 656, abs=0.01)
    average = average_compression_ratio(ratios, steps=steps, total_steps=1000)
    assert average == pytest.approx(sum(ratios) / len(ratios))


def test_exact_handover_keeps_the_function_and_s_shift_raises_average_compression():
    averages = {}
    for s_shift in (0.25, 1.0):
        torch.manual_seed(0)
        net = mlp()
        schedule = GSTSchedule(config(s_shift=s_shift, handover="exact", block_schedule=((0.0, 4),)))
        ratios, _, events = train_with_schedule(schedule, net)
        assert events["hand_over"][0][1] < 1e-5
        averages[s_shift] = sum(ratios) / len(ratios)
    assert averages[0.25] > averages[1.0]


def test_covered_fraction_of_a_wide_network():
    torch.manual_seed(0)
    net = mlp((8, 64, 64, 64, 2))
    schedule = GSTSchedule(config())
    schedule.apply_(net, 0)
    report = schedule.last_reports["block_circulant"]
    hand_count = 2 * 64 * 64 / (8 * 64 + 2 * 64 * 64 + 64 * 2)
    assert report.covered_fraction == pytest.approx(hand_count) == covered_fraction(net)


def test_execute_on_named_layers_keeps_a_twin_network_in_step_through_hooks():
    """The path a training framework takes: it names the layers and chains, and its hooks mirror a twin."""
    torch.manual_seed(0)
    pair = nn.ModuleDict({"online": mlp(), "twin": mlp()})
    pair["twin"].load_state_dict(pair["online"].state_dict())
    eligible, chain = ["online.2", "online.4"], [f"online.{i}" for i in (0, 2, 4, 6)]

    def twin_of(name: str) -> nn.Module:
        return pair.get_submodule(name.replace("online", "twin", 1))

    calls = []

    def mirror_layer(name, transform):
        calls.append(f"mirror_layer {name}")
        transform(twin_of(name))

    def mirror_chain(chain_name, transform):
        calls.append(f"mirror_chain {chain_name}")
        transform([twin_of(name) for name in chain])

    def after_prune(previous):
        calls.append("after_prune")
        for name in eligible:  # the twin takes the online masks (chosen from the online weights only)
            mask = mask_of(*stored_target(pair.get_submodule(name)))
            prune_with_mask_(*stored_target(twin_of(name)), mask.clone())

    hooks = GSTHooks(
        mirror_layer=mirror_layer,
        mirror_chain=mirror_chain,
        after_prune=after_prune,
        after_structure_change=lambda changed: calls.append("after_structure_change"),
        after_action=lambda action, report: calls.append(action.kind),
    )
    schedule = GSTSchedule(config(s_shift=0.6))  # pruning begins at 300, after the transition at 200
    x = torch.randn(8, 6)
    for step in range(0, 1000, 10):
        before = pair["online"](x).detach()
        actions = schedule.apply_(pair, step, [1.0], layers=eligible, chains={"online": chain}, hooks=hooks)
        torch.testing.assert_close(pair["twin"](x), pair["online"](x), rtol=0, atol=0)  # in step throughout
        if any(a.kind == "transition" for a in actions):
            assert (pair["online"](x) - before).abs().max() < 1e-5  # exact: the function is kept
        for name in eligible:
            assert block_size_of(pair.get_submodule(name)) == block_size_of(twin_of(name))
    assert calls[:9] == [
        "mirror_layer online.2",
        "mirror_layer online.4",
        "after_structure_change",
        "block_circulant",
        "mirror_chain online",
        "after_structure_change",
        "transition",
        "after_prune",
        "prune",
    ]
    assert calls[calls.index("hand_over") - 2 : calls.index("hand_over")] == [
        "after_prune",
        "after_structure_change",
    ]
    reports = schedule.last_reports
    assert reports["transition"].compressed == eligible and max(reports["transition"].shift.values()) < 1e-6
    # the hand-over acts on every block-circulant layer of the module, the twin's included
    assert sorted(reports["hand_over"].compressed) == ["online.2", "online.4", "twin.2", "twin.4"]
    assert reports["prune"].compressed == eligible and sparsity_of(pair["online"][2]) == pytest.approx(
        0.9, abs=0.01
    )
    assert sparsity_of(pair["online"][0]) == sparsity_of(pair["twin"][0]) == 0.0  # named layers only


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(total_steps=0), "total_steps"),
        (dict(block_schedule=((0.1, 4),)), "start with"),
        (dict(block_schedule=((0.0, 4), (0.3, 2), (0.2, 1))), "increase"),
        (dict(block_schedule=((0.0, 4), (0.6, 2))), "before bc_end"),
        (dict(block_schedule=((0.0, 4), (0.2, 3))), "divide the previous"),
        (dict(block_schedule=((0.0, 0),)), "positive int"),
        (dict(bc_end=0.0), "bc_end"),
        (dict(s_shift=1.5), "s_shift"),
        (dict(prune_every=0), "prune_every"),
        (dict(handover="smooth"), "handover"),
        (dict(transition_method="svd"), "transition_method"),
        (dict(scope="net"), "scope"),
        (dict(target="vectors"), "target"),
        (dict(bc_init="zeros"), "bc_init"),
        (dict(optimizer_reset="some"), "optimizer_reset"),
    ],
)
def test_bad_config_is_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        config(**overrides)


def test_schedule_feeds_the_trend_guard_before_pruning_begins():
    """Rewards seen before the rise step become the reference trend; a slower rise afterwards holds the target."""
    legacy = dict(rule="windowed", input_window=1, window=1, step_size=0.1, max_sparsity=0.9)
    guard = RewardAwareConfig(**legacy, trend_ratio=0.5, trend_window=4)
    schedule = GSTSchedule(config(sparsity=guard, target="stored"))
    # +1 per 50 steps before the rise step (200), +0.1 per 50 steps afterwards
    actions = decisions(schedule, rewards=lambda step: step / 50 if step < 200 else 4 + (step - 200) / 500)
    assert schedule.controller.reference_slope == pytest.approx(1.0)
    assert schedule.controller.last_decision == "hold_trend"
    prunes = [a for a in actions if a[1] == "prune"]
    # the first updates still rise: the trend window holds pre-pruning rewards until it is refilled
    assert prunes and max(a[3] for a in prunes) <= 0.4
    unguarded = GSTSchedule(config(sparsity=RewardAwareConfig(**legacy), target="stored"))
    decisions(unguarded, rewards=lambda step: step / 50 if step < 200 else 4 + (step - 200) / 500)
    assert unguarded.controller.target == pytest.approx(0.9)


def layer_compressions(net: nn.Module) -> list[float]:
    """Return each hidden layer's compression: 1 - stored / dense weights."""
    return [1.0 - stored_weight_count(net[i]) / net[i].weight.numel() for i in (2, 4)]


@pytest.mark.parametrize("target", ["compression", "stored"])
def test_the_cap_bounds_every_layers_compression_in_every_phase(target):
    """The target is each layer's compression: it rises to max_sparsity and never above it, the hand-over
    included. The earlier target on the B-vectors overshoots the cap while block-circulant (0.975 at 0.9
    and B = 4) and gives weights back at the hand-over."""
    torch.manual_seed(0)
    net = mlp()
    schedule = GSTSchedule(config(block_schedule=((0.0, 4),), s_shift=0.0, target=target))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    per_step = []
    for step in range(0, 1000, 10):
        schedule.apply_(net, step, [1.0], optimizers=[optimizer])
        per_step.append((step, layer_compressions(net)))
    peak = max(max(c) for _, c in per_step)
    at_handover = [c for step, c in per_step if step == 500][0]
    before_handover = [c for step, c in per_step if step == 490][0]
    if target == "compression":
        # 64 vector entries per layer: pruning 60% of them keeps 26, a compression of 0.898
        assert peak == pytest.approx(0.9, abs=0.01) and all(c <= 0.9 for _, cs in per_step for c in cs)
        assert at_handover == pytest.approx(before_handover, abs=0.01)  # continuous through the hand-over
        assert per_step[-1][1] == pytest.approx([0.9, 0.9], abs=0.01)
    else:  # the defect, kept for the ablation
        assert peak > 0.97 and min(at_handover) < min(before_handover) - 0.05


def test_gst_starts_from_the_dense_initialisations_scale():
    for bc_init, factor in (("scaled", 1.0), ("projection", 0.5)):
        torch.manual_seed(0)
        net = mlp((6, 64, 64, 64, 3))
        std = float(net[2].weight.std())
        GSTSchedule(config(bc_init=bc_init)).apply_(net, 0)
        assert is_block_circulant(net[2])
        assert float(net[2].weight.std()) == pytest.approx(std * factor, rel=0.05)


@pytest.mark.parametrize("optimizer_reset", ["changed", "all"])
def test_a_structural_change_resets_only_the_optimizer_state_it_made_stale(optimizer_reset):
    """The hand-over and an exact transition drop the moments of what they re-structure or permute; the
    dense first and last layers (and, at the hand-over, every bias) keep theirs unless ``"all"``."""
    torch.manual_seed(0)
    net = mlp()
    schedule = GSTSchedule(config(s_shift=1.0, optimizer_reset=optimizer_reset))  # no pruning before 500
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(16, 6)
    kept_at = {}
    for step in range(0, 510, 10):
        states = {id(p): {k: v.clone() for k, v in optimizer.state[p].items()} for p in optimizer.state}
        actions = schedule.apply_(net, step, [1.0], optimizers=[optimizer])
        kinds = {a.kind for a in actions} - {"prune"}
        if kinds and step > 0:
            kept_at[kinds.pop()] = {
                name.replace("_orig", "").replace("parametrizations.weight.original", "weight"): id(p)
                in states
                and p in optimizer.state
                and all(torch.equal(v, states[id(p)][k]) for k, v in optimizer.state[p].items())
                for name, p in net.named_parameters()
            }
        optimizer.zero_grad()
        net(x).square().mean().backward()
        optimizer.step()
    first_last = ["0.weight", "0.bias", "6.weight", "6.bias"]
    if optimizer_reset == "all":
        assert not any(any(kept.values()) for kept in kept_at.values())
        return
    handover, transition = kept_at["hand_over"], kept_at["transition"]
    assert all(handover[name] for name in first_last + ["2.bias", "4.bias"])
    assert not handover["2.weight"] and not handover["4.weight"]
    # the exact split permutes the hidden units around layers 2 and 4 (rows and biases of the layers
    # before them, columns of the layers after); the output layer's bias keeps its state
    assert transition["6.bias"] and not any(
        transition[name] for name in ["0.weight", "0.bias", "2.bias", "6.weight"]
    )


def test_a_block_size_that_alone_compresses_past_the_cap_is_refused():
    # B = 4 stores a quarter of a layer (75% compression) before any pruning: above a 0.7 cap
    with pytest.raises(
        ValueError, match=r"block size 4 compresses a layer by 75.0%.*at most 3.*at least 0.75"
    ):
        GSTConfig(total_steps=100, block_schedule=((0.0, 4),), sparsity=RewardAwareConfig(max_sparsity=0.7))
    with pytest.raises(ValueError, match="block size 4"):  # a later block size counts too
        GSTConfig(total_steps=100, block_schedule=((0.0, 2), (0.2, 4)), transition_method="projection",
                  sparsity=RewardAwareConfig(max_sparsity=0.7))  # fmt: skip
    for block, cap in ((4, 0.75), (2, 0.7), (2, 0.5), (8, 0.9)):
        GSTConfig(
            total_steps=100, block_schedule=((0.0, block),), sparsity=RewardAwareConfig(max_sparsity=cap)
        )
    # the earlier rule prunes the stored values, so the cap never bounded compression there
    GSTConfig(
        total_steps=100,
        block_schedule=((0.0, 4),),
        sparsity=RewardAwareConfig(max_sparsity=0.7),
        target="stored",
    )
