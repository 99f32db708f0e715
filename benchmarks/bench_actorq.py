"""ActorQ benchmark: actor throughput with quantized vs fp32 policies of the paper's size, and time to a return.

Part 1 runs one ActorQ actor (``rlq.actorq.actor.ActorWorker``, one thread, in this process) on DeepMind
Control cartpole-balance with the paper's 2048x3 MLP policy, for each inference engine and precision, twice:
acting only (the policy never changes), and with a new policy to pull, decode and load at every pull
(every ``update_period`` steps: the worst case of a learner that broadcasts faster than actors pull).
Part 2 trains int8 and fp32 actors end to end with the local backend (same learner, same seed, a small
network and budget: TD3 on Pendulum-v1, which learns in a few thousand updates) and reports the training
wall-clock until the evaluation return first reaches a threshold.

    .venv/bin/python benchmarks/bench_actorq.py                  # both parts, about 2-3 minutes on 2 cores
    .venv/bin/python benchmarks/bench_actorq.py --skip-e2e --steps 3000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from rlq.actorq import ActorQConfig, PolicyArchitecture, PolicyNet, encode_policy, train
from rlq.actorq.actor import ActorWorker, LocalPolicyStore
from rlq.quant.latency import torch_threads
from rlq.rl.envs import make_env

ENGINES = [  # (actor precision, backend, broadcast precision)
    ("fp32", "torch", "fp32"),
    ("fp32", "onnx", "fp32"),
    ("fp16", "torch", "fp16"),
    ("int8", "torch", "int8"),
    ("int8", "onnx", "int8"),
]


def paper_architecture(env_id: str, hidden: tuple[int, ...]) -> PolicyArchitecture:
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
    )
    env.close()
    return arch


def actor_throughput(env_id: str, hidden: tuple[int, ...], steps: int, period: int) -> list[dict]:
    arch = paper_architecture(env_id, hidden)
    torch.manual_seed(0)
    weights = {k: v.detach().numpy().copy() for k, v in PolicyNet(arch).state_dict().items()}
    rows = []
    for precision, backend, comm in ENGINES:
        blob = encode_policy(weights, comm, version=1)
        for new_policy_every_pull in (False, True):
            store = LocalPolicyStore()
            store.publish(blob, 1)
            worker = ActorWorker(0, env_id, arch, precision, backend, seed=0, noise=0.1)
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
    args = parser.parse_args()

    print(f"Part 1: one actor, {args.env_id}, MLP {'x'.join(map(str, args.hidden))}, batch 1, one thread, "
          f"pull every {args.update_period} steps, {args.steps} steps per row")  # fmt: skip
    rows = actor_throughput(args.env_id, tuple(args.hidden), args.steps, args.update_period)
    fp32 = {r["new_policy_every_pull"]: r["steps_per_s"] for r in rows if r["engine"] == "torch-fp32"}
    print(f"{'engine':<11} {'sent as':<7} {'new policy':<10} {'steps/s':>8} {'vs torch-fp32':>13} "
          f"{'infer us':>9} {'env us':>7} {'load ms':>8} {'MB sent':>8}")  # fmt: skip
    for r in rows:
        print(
            f"{r['engine']:<11} {r['comm']:<7} {'every pull' if r['new_policy_every_pull'] else 'never':<10} "
            f"{r['steps_per_s']:>8.0f} {r['steps_per_s'] / fp32[r['new_policy_every_pull']]:>12.2f}x "
            f"{r['inference_us']:>9.0f} {r['env_us']:>7.0f} {r['load_ms']:>8.1f} {r['bytes'] / 1e6:>8.2f}"
        )
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
