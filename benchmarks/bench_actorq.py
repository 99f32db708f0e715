"""ActorQ benchmark: actor throughput with quantized vs fp32 policies of the paper's size, and time to a return.

Part 1 runs one ActorQ actor (``rlq.actorq.actor.ActorWorker``, one thread, in this process) on DeepMind
Control cartpole-balance with the paper's 2048x3 MLP policy, for each inference engine and precision, twice:
acting only (the policy never changes), and with a new policy to pull, decode and load at every pull
(every ``update_period`` steps: the worst case of a learner that broadcasts faster than actors pull).
Part 1 also runs the compiled engine (``actor_backend="compiled"``, rlq.deploy's kernels) on the same dense
policy and on a block-circulant one (``--block-size``, its B-vectors broadcast).
Part 2 trains int8 and fp32 actors end to end with the local backend (same learner, same seed, a small
network and budget: TD3 on Pendulum-v1, which learns in a few thousand updates) and reports the training
wall-clock until the evaluation return first reaches a threshold.
Part 3 measures compressed actors end to end: the paper's 2048x3 policy trained by the learner (D4PG) with fp32
actors and int8 actors (dense policy, the fastest engine measured at start) and with compiled int8 actors of a
block-circulant policy (B = ``--block-size``, trained in fp32, its B-vectors broadcast), in two regimes with a
64x64 critic at batch 32: actor-bound (one update per 80 environment steps) and the paper's update rate (one
update per 8 steps). Each regime's runs go back to back; the steady environment steps per second (between
the evaluations after learning began) are compared side by side, with the cost model's prediction
(:func:`rlq.actorq.cost_model.predict_seconds_per_step`, each run's own measured costs) beside them.

    .venv/bin/python benchmarks/bench_actorq.py                  # parts 1 and 2, about 2-3 minutes on 2 cores
    .venv/bin/python benchmarks/bench_actorq.py --skip-e2e --steps 3000
    .venv/bin/python benchmarks/bench_actorq.py --skip-actors --skip-e2e --compressed  # part 3 only
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import numpy as np

from rlq.actorq import ActorQConfig, PolicyArchitecture, encode_policy, random_policy, ray_session, train
from rlq.actorq.actor import ActorWorker, Exploration, LocalPolicyStore
from rlq.actorq.cost_model import Topology, predict_seconds_per_step, result_costs, steady_steps_per_s
from rlq.quant.latency import torch_threads
from rlq.rl.envs import make_env

ENGINES = [  # (actor precision, backend, broadcast precision, block-circulant policy)
    ("fp32", "torch", "fp32", False),
    ("fp32", "onnx", "fp32", False),
    ("fp16", "torch", "fp16", False),
    ("int8", "torch", "int8", False),
    ("int8", "onnx", "int8", False),
    ("int8", "compiled", "int8", False),
    ("int8", "onnx", "int8", True),
    ("int8", "compiled", "int8", True),
]
ARMS = [  # (name, actor precision, actor backend, block-circulant policy) of part 3; the first is the reference
    ("fp32", "fp32", "auto", False),
    ("int8 dense", "int8", "auto", False),
    ("compiled int8 B", "int8", "compiled", True),
]
REGIMES = {  # part 3: name -> (samples per insert at batch 32, what it stands for)
    "actor_bound": (0.4, "one update per 80 env steps"),
    "paper_rate": (4.0, "one update per 8 env steps, the paper's rate (32 samples per insert at batch 256)"),
}


def paper_architecture(
    env_id: str, hidden: tuple[int, ...], block_size: int | None = None
) -> PolicyArchitecture:
    env = make_env(env_id)
    space = env.action_space
    arch = PolicyArchitecture(
        obs_dim=int(np.prod(env.observation_space.shape)),
        act_dim=int(np.prod(space.shape)),
        hidden_sizes=hidden,
        activation="relu",
        stochastic=False,
        action_low=tuple(map(float, space.low)),
        action_high=tuple(map(float, space.high)),
        block_size=block_size,
    )
    env.close()
    return arch


def actor_throughput(
    env_id: str, hidden: tuple[int, ...], steps: int, period: int, block_size: int
) -> list[dict]:
    rows = []
    for precision, backend, comm, circulant in ENGINES:
        arch = paper_architecture(env_id, hidden, block_size if circulant else None)
        blob = encode_policy(random_policy(arch).weights, comm, version=1)
        for new_policy_every_pull in (False, True):
            store = LocalPolicyStore()
            store.publish(blob, 1)
            worker = ActorWorker(
                0, env_id, arch, precision, backend, seed=0, exploration=Exploration(noise=0.1)
            )
            with torch_threads(1):
                worker.run(period, store)  # warm-up: first load, first episode
                totals: dict[str, float] = {}
                version, done, start = 1, 0, time.perf_counter()
                while done < steps:
                    if new_policy_every_pull:
                        version += 1
                        store.publish(blob, version)
                    chunk = worker.run(period, store)
                    done += chunk.steps
                    for key, value in chunk.timings.items():
                        totals[key] = totals.get(key, 0.0) + value
                elapsed = time.perf_counter() - start
            worker.close()
            rows.append(
                dict(
                    engine=f"{backend}-{precision}",
                    policy=f"B={block_size}" if circulant else "dense",
                    comm=comm,
                    new_policy_every_pull=new_policy_every_pull,
                    steps_per_s=done / elapsed,
                    inference_us=1e6 * totals["actor_inference"] / done,
                    env_us=1e6 * totals["actor_env_step"] / done,
                    load_ms=1e3 * (totals["actor_deserialize"] + totals["actor_load"]) / (done // period),
                    bytes=len(blob),
                )
            )
    return rows


def end_to_end(env_id: str, threshold: float, learner_steps: int, seed: int) -> list[dict]:
    rows = []
    for precision in ("fp32", "int8"):
        config = ActorQConfig(
            env_id=env_id,
            algorithm="TD3",
            n_actors=2,
            actor_precision=precision,
            actor_backend="auto",
            hidden_sizes=(64, 64),
            batch_size=128,
            samples_per_insert=128.0,  # one update per environment step, as SB3's TD3 default
            gamma=0.98,
            learning_starts=1000,
            learner_steps=learner_steps,
            update_period=10,
            max_insert_lead=100,
            eval_every=500,
            eval_episodes=3,
            seed=seed,
            torch_threads=1,
            backend="local",
        )
        result = train(config)
        actor_seconds = sum(v for k, v in result.breakdown.items() if k.startswith("actor_"))
        reached = result.history[result.history["eval_return"] >= threshold]
        rows.append(
            dict(
                precision=precision,
                engine=result.actor_backend,
                time_to_threshold_s=result.time_to_return(threshold),
                steps_to_threshold=None if reached.empty else int(reached["learner_steps"].iloc[0]),
                wall_time_s=result.wall_time_s,
                best_return=float(result.history["eval_return"].max()),
                actor_steps_per_s=result.actor_steps_per_s,
                actor_share=actor_seconds / result.wall_time_s,
            )
        )
    return rows


def compressed_end_to_end(
    env_id: str, hidden: tuple[int, ...], block_size: int, learner_steps: int, seed: int, backend: str
) -> list[dict]:
    """Part 3: the arms of :data:`ARMS` in each regime of :data:`REGIMES`, back to back, measured and predicted."""
    rows = []
    with ray_session(num_cpus=os.cpu_count()) if backend == "ray" else contextlib.nullcontext():
        for regime, (samples_per_insert, _) in REGIMES.items():
            steps = max(4, round(learner_steps * samples_per_insert / 4.0))  # about the same env steps
            for name, precision, actor_backend, circulant in ARMS:
                config = ActorQConfig(
                    env_id=env_id, algorithm="D4PG", hyperparams={"n_steps": 5, "v_min": -150.0, "v_max": 150.0},
                    n_actors=1, actor_precision=precision, actor_backend=actor_backend, hidden_sizes=hidden,
                    critic_hidden_sizes=(64, 64), batch_size=32, samples_per_insert=samples_per_insert,
                    learner_steps=steps, learning_starts=500, update_period=30, broadcast_every=5,
                    eval_every=max(1, steps // 2), eval_episodes=1, seed=seed, torch_threads=1, backend=backend,
                    ray_num_cpus=os.cpu_count(), policy_block_size=block_size if circulant else None,
                )  # fmt: skip
                result = train(config)
                costs = result_costs(result)
                layout, cores = ("serial", 1.0) if backend == "local" else ("parallel", float(os.cpu_count()))
                predicted, bound = predict_seconds_per_step(
                    costs, Topology(1, cores, layout), samples_per_insert, config.batch_size
                )
                rows.append(
                    dict(
                        regime=regime,
                        arm=name.replace(" B", f" B={block_size}"),
                        engine=result.actor_backend,
                        steps_per_s=steady_steps_per_s(result.history),
                        predicted_steps_per_s=1.0 / predicted,
                        bound=bound,
                        actor_ms_per_step=1e3 * costs.actor_seconds_per_step,
                        learner_ms_per_update=1e3 * costs.learner_seconds_per_update,
                        bytes=result.bytes_per_broadcast,
                        env_steps=result.env_steps,
                        learner_steps=result.learner_steps,
                    )
                )
    return rows


def print_compressed(rows: list[dict]) -> None:
    """Print part 3: per regime, each arm's measured and predicted speedup over the fp32 and int8-dense arms."""
    print(f"{'regime':<12} {'arm':<19} {'engine':<14} {'steps/s':>8} {'vs fp32':>8} {'pred':>6} "
          f"{'vs int8':>8} {'pred':>6} {'binds':>7} {'actor ms':>9} {'update ms':>9} {'KB sent':>8}")  # fmt: skip
    for regime in REGIMES:
        runs = [r for r in rows if r["regime"] == regime]
        fp32, int8 = runs[0], runs[1]
        for r in runs:
            print(
                f"{regime:<12} {r['arm']:<19} {r['engine']:<14} {r['steps_per_s']:>8.0f} "
                f"{r['steps_per_s'] / fp32['steps_per_s']:>7.2f}x "
                f"{r['predicted_steps_per_s'] / fp32['predicted_steps_per_s']:>5.2f}x "
                f"{r['steps_per_s'] / int8['steps_per_s']:>7.2f}x "
                f"{r['predicted_steps_per_s'] / int8['predicted_steps_per_s']:>5.2f}x {r['bound']:>7} "
                f"{r['actor_ms_per_step']:>9.2f} {r['learner_ms_per_update']:>9.1f} {r['bytes'] / 1e3:>8.1f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="dm_control/cartpole-balance-v0")
    parser.add_argument("--hidden", type=int, nargs="+", default=[2048, 2048, 2048])
    parser.add_argument("--steps", type=int, default=1500, help="actor steps per engine and case")
    parser.add_argument("--update-period", type=int, default=30)
    parser.add_argument("--e2e-env-id", default="Pendulum-v1", help="environment of part 2")
    parser.add_argument("--threshold", type=float, default=-400.0, help="evaluation return for part 2")
    parser.add_argument("--e2e-learner-steps", type=int, default=7000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--skip-actors", action="store_true", help="skip part 1")
    parser.add_argument(
        "--block-size", type=int, default=16, help="B of the block-circulant policy (parts 1, 3)"
    )
    parser.add_argument("--compressed", action="store_true", help="run part 3 (compressed actors end to end)")
    parser.add_argument("--compressed-learner-steps", type=int, default=200,
                        help="part 3: learner steps at the paper's rate (scaled to about the same env steps elsewhere)")  # fmt: skip
    parser.add_argument(
        "--backend", default="local", choices=["local", "ray"], help="part 3's ActorQ backend"
    )
    args = parser.parse_args()

    if not args.skip_actors:
        print(f"Part 1: one actor, {args.env_id}, MLP {'x'.join(map(str, args.hidden))}, batch 1, one thread, "
              f"pull every {args.update_period} steps, {args.steps} steps per row")  # fmt: skip
        rows = actor_throughput(
            args.env_id, tuple(args.hidden), args.steps, args.update_period, args.block_size
        )
        fp32 = {r["new_policy_every_pull"]: r["steps_per_s"] for r in rows if r["engine"] == "torch-fp32"}
        print(f"{'engine':<13} {'policy':<6} {'sent as':<7} {'new policy':<10} {'steps/s':>8} {'vs torch-fp32':>13} "
              f"{'infer us':>9} {'env us':>7} {'load ms':>8} {'MB sent':>8}")  # fmt: skip
        for r in rows:
            print(
                f"{r['engine']:<13} {r['policy']:<6} {r['comm']:<7} "
                f"{'every pull' if r['new_policy_every_pull'] else 'never':<10} "
                f"{r['steps_per_s']:>8.0f} {r['steps_per_s'] / fp32[r['new_policy_every_pull']]:>12.2f}x "
                f"{r['inference_us']:>9.0f} {r['env_us']:>7.0f} {r['load_ms']:>8.1f} {r['bytes'] / 1e6:>8.2f}"
            )
    if args.compressed:
        print(f"\nPart 3: compressed actors end to end, {args.backend} backend, D4PG on {args.env_id}, 1 actor, "
              f"policy {'x'.join(map(str, args.hidden))}, critic 64x64, batch 32; steps/s between the "
              "evaluations after learning began; pred: the cost model on each run's own costs")  # fmt: skip
        for regime, (spi, what) in REGIMES.items():
            print(f"  {regime}: {spi:g} samples per insert, {what}")
        print_compressed(
            compressed_end_to_end(
                args.env_id, tuple(args.hidden), args.block_size, args.compressed_learner_steps, args.seed,
                args.backend,
            )
        )  # fmt: skip
    if args.skip_e2e:
        return
    print(f"\nPart 2: end to end, local backend, TD3 on {args.e2e_env_id}, 2 actors, MLP 64x64, "
          f"{args.e2e_learner_steps} learner steps, threshold {args.threshold:g}")  # fmt: skip
    e2e = end_to_end(args.e2e_env_id, args.threshold, args.e2e_learner_steps, args.seed)
    for r in e2e:
        reached = (
            "not reached"
            if r["time_to_threshold_s"] is None
            else f"{r['time_to_threshold_s']:.1f} s (learner step {r['steps_to_threshold']})"
        )
        print(
            f"{r['precision']:<5} ({r['engine']}): time to {args.threshold:g}: {reached:>11}; training wall-clock "
            f"{r['wall_time_s']:.1f} s; best return {r['best_return']:.0f}; actor {r['actor_steps_per_s']:.0f} steps/s; "
            f"actors' share of the time {r['actor_share']:.0%}"
        )
    times = {r["precision"]: r["time_to_threshold_s"] for r in e2e}
    if times["fp32"] is not None and times["int8"] is not None:
        print(
            f"wall-clock speedup int8 vs fp32 to return {args.threshold:g}: {times['fp32'] / times['int8']:.2f}x "
            "(at this size the actors hold a few percent of the time: the rest is the learning curves' spread)"
        )


if __name__ == "__main__":
    main()
