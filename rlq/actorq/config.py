"""The one validated configuration of an ActorQ run: every knob, checked before anything starts."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from rlq.core.validation import check_non_negative_int, check_positive_int

ALGORITHMS = ("TD3", "DDPG", "SAC", "D4PG")
"""Off-policy algorithms the learner can run (continuous actions): SB3's, and D4PG from ``rlq.actorq.d4pg``."""
BACKENDS = ("local", "ray")
"""Execution engines: one process (tests, debugging) or Ray actors."""
ACTOR_BACKENDS = ("auto", "torch", "onnx", "compiled")
"""Inference engines of the actors: PyTorch, ONNX Runtime, rlq's compiled policy kernels (:mod:`rlq.deploy`), or
the fastest by measurement (auto: torch and onnx, and compiled where its kernels are built)."""
COMPILED_PRECISIONS = ("fp32", "int8")
"""Precisions compiled actors act at: :func:`rlq.deploy.compile_policy`'s."""

#: Fields that define what is trained; a resumed run must match them (budgets and engine may change).
IDENTITY_FIELDS = (
    "env_id",
    "algorithm",
    "hidden_sizes",
    "critic_hidden_sizes",
    "activation",
    "batch_size",
    "buffer_size",
    "gamma",
    "learning_rate",
    "max_grad_norm",
    "policy_output_init",
    "policy_block_size",
)


def learner_device(name: str) -> str:
    """Return the learner device for ``name``: cpu, cuda, or for auto cuda when PyTorch sees a GPU, else cpu."""
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cpu" and not (isinstance(name, str) and name.startswith("cuda")):
        raise ActorQConfigError(f"learner device {name!r}: choose cpu, cuda or auto")
    return name


class ActorQConfigError(ValueError):
    """A bad ActorQ configuration: raised before any process, model or environment is started."""


@dataclass
class ActorQConfig:
    """Configuration of ActorQ training (Krishnan et al., QuaRL, arXiv 1910.01055, section 5).

    A learner trains an SB3 off-policy agent in fp32 on its replay buffer; a broadcaster quantizes the
    current policy to ``comm_precision`` and publishes it; ``n_actors`` actors pull it every
    ``update_period`` steps, act with ``actor_precision`` inference and send their transitions back.
    """

    env_id: str = "dm_control/cartpole-balance-v0"
    """Environment id known to ``rlq.rl.envs`` with a continuous (Box) action space."""
    algorithm: str = "TD3"
    """Learner algorithm: TD3, DDPG, SAC or D4PG (the paper's; n_steps, n_atoms, v_min, v_max via hyperparams)."""
    n_actors: int = 4
    """Number of actors collecting experience (the paper uses 4)."""
    actor_precision: str = "int8"
    """Precision the actors act with: fp32, fp16, int8 (real int8 kernels) or int2..int16 (simulated)."""
    comm_precision: str | None = None
    """Precision of the broadcast policy: fp32, fp16, bf16, int2..int16; None sends at actor_precision."""
    actor_backend: str = "auto"
    """Actor inference engine: torch, onnx (ONNX Runtime), compiled (rlq.deploy's C kernels: block-circulant layers
    in the frequency domain, layers pruned in whole blocks block-sparse, others dense int8 or fp32; NumPy where
    the kernels are not built) or auto (the fastest measured at start; compiled is a candidate where built)."""
    update_period: int = 30
    """Environment steps an actor takes between two pulls of the latest policy (paper: 30)."""
    learner_steps: int = 10_000
    """Gradient steps of the learner: the training budget."""
    samples_per_insert: float = 32.0
    """Replay rate limit: samples the learner draws per transition inserted (updates per env step = this / batch_size)."""
    max_insert_lead: int = 500
    """Transitions the actors may run ahead of the rate limit before they are paused."""
    learning_starts: int = 1_000
    """Transitions in the replay buffer before the learner starts; actors act uniformly at random until then."""
    batch_size: int = 256
    """Learner minibatch size (paper: 256)."""
    buffer_size: int = 1_000_000
    """Replay buffer capacity in transitions."""
    hidden_sizes: tuple[int, ...] = (2048, 2048, 2048)
    """Hidden layer widths of the policy MLP (paper: 2048x3)."""
    critic_hidden_sizes: tuple[int, ...] | None = None
    """Hidden layer widths of the critic MLP; None uses hidden_sizes."""
    policy_block_size: int | None = None
    """B of a block-circulant policy: the learner trains its hidden-to-hidden layers as B-vectors in fp32 (as GST
    does; first layer, heads and critic dense) and broadcasts the B-vectors, 1/B of those layers' dense values.
    It must divide the widths of those layers; None trains a dense policy."""
    activation: str = "relu"
    """Hidden activation of both networks: relu or tanh."""
    learning_rate: float = 1e-4
    """Adam learning rate of actor and critic (Acme's D4PG: 1e-4; at 1e-3 a 2048x3 policy's tanh saturates
    within a few updates and stays there)."""
    max_grad_norm: float | None = 40.0
    """Global-norm clipping of the actor's and the critic's gradients, D4PG's learner only (Acme: 40); None: off."""
    policy_output_init: float = 1e-4
    """Variance scale of the policy's last layer at initialisation (truncated normal, std sqrt(scale / fan_in):
    Acme's near-zero initialised output layer), so the first actions sit in tanh's linear range; 0 keeps
    PyTorch's default initialisation."""
    gamma: float = 0.99
    """Discount factor."""
    exploration_noise: float = 0.3
    """Std of the Gaussian action noise of the actors, in units of the [-1, 1] action range (Acme's D4PG: 0.3)."""
    hyperparams: dict[str, Any] = field(default_factory=dict)
    """Further SB3 arguments of the algorithm, e.g. {"tau": 0.005, "policy_delay": 2}."""
    broadcast_every: int = 1
    """Learner steps between two broadcasts of the policy."""
    eval_every: int = 1_000
    """Learner steps between two evaluations of the actors' (quantized, noise-free) policy."""
    eval_episodes: int = 5
    """Episodes per evaluation, on fixed seeds so that evaluations compare."""
    seed: int = 0
    """Seeds the learner, the actors' environments and noise, and evaluation."""
    backend: str = "local"
    """Engine: local (all roles in one process, deterministic) or ray (actors are Ray actors)."""
    ray_address: str | None = None
    """Address of an existing Ray cluster to join (e.g. "auto"); None starts a local Ray instance."""
    ray_num_cpus: int | None = None
    """CPUs of a Ray instance started here; None uses every core."""
    max_actor_restarts: int = 3
    """Times a dead Ray actor is restarted before training goes on without it."""
    checkpoint_dir: str | None = None
    """Folder for learner checkpoints; a run given a folder that holds one resumes from it."""
    checkpoint_every: int = 0
    """Learner steps between checkpoints; 0 saves only at the end."""
    torch_threads: int | None = None
    """PyTorch threads of the learner; None leaves the current setting (actors always use one thread)."""
    device: str = "cpu"
    """Learner device: cpu or cuda (actors always run on CPU)."""

    def __post_init__(self) -> None:
        self.hidden_sizes = (
            tuple(self.hidden_sizes) if isinstance(self.hidden_sizes, list) else self.hidden_sizes
        )
        if isinstance(self.critic_hidden_sizes, list):
            self.critic_hidden_sizes = tuple(self.critic_hidden_sizes)
        self.validate(check_env=False)

    @property
    def broadcast_precision(self) -> str:
        """Return the precision the policy travels at (comm_precision, or actor_precision when None)."""
        from rlq.quant import parse_precision

        return parse_precision(self.comm_precision or self.actor_precision).name

    @property
    def updates_per_env_step(self) -> float:
        """Return the learner's gradient steps per environment step that the rate limit allows."""
        return self.samples_per_insert / self.batch_size

    def to_dict(self) -> dict[str, Any]:
        """Return the configuration as plain JSON-friendly values."""
        import json

        out = dataclasses.asdict(self)
        for key in ("hidden_sizes", "critic_hidden_sizes"):
            if out[key] is not None:
                out[key] = list(out[key])
        out["hyperparams"] = json.loads(json.dumps(out["hyperparams"], default=repr))  # e.g. a class by name
        return out

    def validate(self, check_env: bool = True) -> ActorQConfig:
        """Return the config after checking every field (and, with ``check_env``, that the env id exists).

        Raises :class:`ActorQConfigError` naming the field, the bad value and the accepted values.
        """
        self._validate_roles()
        self._validate_budgets()
        self._validate_learner()
        self._validate_engine()
        if check_env:
            self._check_env()
        return self

    def _bad(self, name: str, message: str) -> ActorQConfigError:
        return ActorQConfigError(f"ActorQConfig.{name}={getattr(self, name)!r}: {message}")

    def _check_int(self, name: str, minimum: int = 1) -> None:
        """Check that field ``name`` is an int >= ``minimum`` (1 or 0) with :mod:`rlq.core.validation`."""
        check = check_positive_int if minimum == 1 else check_non_negative_int
        try:
            check(f"ActorQConfig.{name}", getattr(self, name))
        except ValueError as e:
            raise ActorQConfigError(str(e)) from None

    def _check_positive_number(self, name: str) -> None:
        value = getattr(self, name)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise self._bad(name, "must be a positive number")

    def _validate_roles(self) -> None:
        """Check what is trained and who acts: environment, algorithm, actors and their precisions."""
        from rlq.quant import parse_precision

        if not isinstance(self.env_id, str) or not self.env_id:
            raise self._bad(
                "env_id", "must be a non-empty environment id such as dm_control/cartpole-balance-v0"
            )
        if not isinstance(self.algorithm, str) or self.algorithm.upper() not in ALGORITHMS:
            raise self._bad("algorithm", f"choose one of {', '.join(ALGORITHMS)}")
        self.algorithm = self.algorithm.upper()
        self._check_int("n_actors")
        for name in ("actor_precision", "comm_precision"):
            value = getattr(self, name)
            if value is None and name == "comm_precision":
                continue
            try:
                spec = parse_precision(value)
            except (ValueError, TypeError) as e:
                raise self._bad(name, str(e)) from None
            if name == "actor_precision" and spec.name == "bf16":
                raise self._bad(name, "bf16 acting is not supported; choose fp32, fp16, int8 or int2..int16")
            setattr(self, name, spec.name)
        if self.actor_backend not in ACTOR_BACKENDS:
            raise self._bad("actor_backend", f"choose one of {', '.join(ACTOR_BACKENDS)}")
        if self.actor_backend == "onnx" and self.actor_precision not in ("fp32", "int8"):
            raise self._bad(
                "actor_backend", f"ONNX Runtime actors act at fp32 or int8, not {self.actor_precision}"
            )
        if self.actor_backend == "compiled" and self.actor_precision not in COMPILED_PRECISIONS:
            raise self._bad(
                "actor_backend",
                f"compiled actors act at {' or '.join(COMPILED_PRECISIONS)}, not {self.actor_precision}",
            )

    def _validate_budgets(self) -> None:
        """Check the step counts, sizes and rates."""
        for name in ("update_period", "learner_steps", "batch_size", "buffer_size", "broadcast_every"):
            self._check_int(name)
        for name in ("learning_starts", "max_insert_lead", "eval_every", "checkpoint_every", "seed"):
            self._check_int(name, 0)
        self._check_int("eval_episodes")
        self._check_int("max_actor_restarts", 0)
        self._check_positive_number("samples_per_insert")

    def _validate_learner(self) -> None:
        """Check the learner's hyperparameters and networks."""
        self._check_positive_number("learning_rate")
        if self.max_grad_norm is not None:
            self._check_positive_number("max_grad_norm")
        if isinstance(self.policy_output_init, bool) or not self.policy_output_init >= 0:
            raise self._bad(
                "policy_output_init", "must be a number >= 0 (0 keeps the default initialisation)"
            )
        if not 0 < self.gamma <= 1:
            raise self._bad("gamma", "must lie in (0, 1]")
        if isinstance(self.exploration_noise, bool) or not self.exploration_noise >= 0:
            raise self._bad("exploration_noise", "must be a number >= 0")
        self._validate_hidden_sizes()
        self._validate_block_size()
        if self.activation not in ("relu", "tanh"):
            raise self._bad("activation", "choose relu or tanh")
        if not isinstance(self.hyperparams, dict):
            raise self._bad("hyperparams", "must be a dict of SB3 arguments")
        clash = {"policy_kwargs", "batch_size", "buffer_size", "gamma", "learning_rate", "learning_starts"}
        clash &= set(self.hyperparams)
        if clash:
            raise self._bad("hyperparams", f"set {sorted(clash)} through ActorQConfig's own fields")

    def _validate_hidden_sizes(self) -> None:
        """Check the policy's and the critic's hidden widths (the critic's may be None: the policy's)."""
        for name in ("hidden_sizes", "critic_hidden_sizes"):
            sizes = getattr(self, name)
            if sizes is None and name == "critic_hidden_sizes":
                continue
            try:
                if not isinstance(sizes, tuple) or not sizes:
                    raise ValueError(f"{name} is empty")
                for size in sizes:
                    check_positive_int(name, size)
            except ValueError:
                raise self._bad(
                    name, "must be a non-empty list of positive ints, e.g. [2048, 2048, 2048]"
                ) from None

    def _validate_block_size(self) -> None:
        """Check that ``policy_block_size`` divides both widths of every hidden-to-hidden policy layer."""
        b = self.policy_block_size
        if b is None:
            return
        if isinstance(b, bool) or not isinstance(b, int) or b < 2:
            raise self._bad("policy_block_size", "must be an int >= 2 (None trains a dense policy)")
        sizes = self.hidden_sizes
        if len(sizes) < 2:
            raise self._bad(
                "policy_block_size",
                f"a block-circulant policy needs two hidden layers or more (its first layer stays dense); "
                f"hidden_sizes={list(sizes)}",
            )
        for i in range(1, len(sizes)):
            if sizes[i - 1] % b or sizes[i] % b:
                raise self._bad(
                    "policy_block_size",
                    f"does not divide hidden layer {i}'s {sizes[i]}x{sizes[i - 1]} weight "
                    f"(hidden_sizes={list(sizes)})",
                )

    def _validate_engine(self) -> None:
        """Check where and how the run executes: Ray, threads, device, checkpoints."""
        if self.backend not in BACKENDS:
            raise self._bad("backend", f"choose one of {', '.join(BACKENDS)}")
        if self.ray_address is not None and (self.backend != "ray" or not isinstance(self.ray_address, str)):
            raise self._bad("ray_address", "is a Ray cluster address string and needs backend='ray'")
        for name in ("ray_num_cpus", "torch_threads"):
            if getattr(self, name) is not None:
                self._check_int(name)
        if not isinstance(self.device, str) or not (self.device == "cpu" or self.device.startswith("cuda")):
            raise self._bad("device", "choose cpu or cuda")
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, str):
            self.checkpoint_dir = str(self.checkpoint_dir)

    def _check_env(self) -> None:
        import gymnasium as gym

        from rlq.rl.envs import check_env_id, make_env

        try:
            check_env_id(self.env_id)
        except ValueError as e:
            raise ActorQConfigError(f"ActorQConfig.env_id: {e}") from None
        env = make_env(self.env_id)
        try:
            space = env.action_space
            if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
                raise ActorQConfigError(
                    f"ActorQConfig.env_id={self.env_id!r}: ActorQ's learners ({', '.join(ALGORITHMS)}) need a "
                    f"1-d continuous (Box) action space, this environment has {space}"
                )
            if not np_all_finite(space.low, space.high):
                raise ActorQConfigError(
                    f"ActorQConfig.env_id={self.env_id!r}: the action space must be bounded"
                )
            obs = env.observation_space
            if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
                raise ActorQConfigError(
                    f"ActorQConfig.env_id={self.env_id!r}: ActorQ's MLP policies need flat (1-d Box) "
                    f"observations, this environment has {obs}"
                )
        finally:
            env.close()


def np_all_finite(*arrays: Any) -> bool:
    """Return whether every value of every array is finite."""
    import numpy as np

    return all(bool(np.all(np.isfinite(a))) for a in arrays)
