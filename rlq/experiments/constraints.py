"""Constraints a notebook declares for its parameters, checked before a kernel starts.

A parameter's comment may end with a bracket of ``key: value`` pairs separated by commas, beside its
literal (no ``=`` in it: papermill skips a line holding two)::

    timesteps = 20000  # environment steps per run [min: 1]
    delay_fraction = 0.5  # share of training before fake quantization starts [min: 0, max: 1]
    algorithm = "PPO"  # SB3 algorithm [kind: algorithm]
    env_id = "CartPole-v1"  # Gymnasium id [kind: env_id]
    bit_widths = [8, 6, 4]  # bit widths swept [items: int, min: 2, max: 16, min_len: 1]
    method = "gst"  # compression [choices: dense|pruning|gst]

Keys: ``min``/``max`` (inclusive) and ``gt``/``lt`` (exclusive) bounds; ``choices`` (separated by ``|``);
``items`` (the type of a list's items: int, float, str or bool); ``min_len`` (a list's shortest length);
``kind`` (``env_id``: a registered environment; ``algorithm``: an SB3 algorithm name; ``run``: a QuaRL run
``[algorithm, env_id, steps]`` with optional hyperparameters as a 4th item, ``"zoo"`` for rl-zoo3's steps or
settings; ``tuner.<setting>``, e.g. ``tuner.bits``: a value the sparsity tuner accepts for that setting, as
:data:`rlq.experiments.tuner_space.SETTING_RANGES` declares it); ``nonfinite: ok`` (NaN and infinity are
meaningful here); ``unique: yes`` (a list's items must not repeat, e.g. seeds). For a list, bounds, choices
and kind apply to every item.

Whatever is declared or not, a float that is NaN or infinite is rejected (unless ``nonfinite: ok``), and
the items of a list whose default holds items of one type must have that type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ITEM_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
KINDS = ("env_id", "algorithm", "run")
_BRACKET = re.compile(r"\[(\s*\w+:[^\]]*)\]\s*$")


class ConstraintError(ValueError):
    """A parameter's value breaks its declared constraint (or a notebook declares a malformed one)."""


@dataclass(frozen=True)
class Constraint:
    """What a parameter's value must satisfy beyond its type."""

    min: float | None = None
    max: float | None = None
    gt: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] | None = None
    items: type | None = None
    min_len: int | None = None
    kind: str | None = None
    nonfinite: bool = False
    unique: bool = False

    def describe(self) -> str:
        """Return the constraint in words, e.g. ``>= 1, <= 16``."""
        parts = []
        for key, op in (("min", ">="), ("gt", ">"), ("max", "<="), ("lt", "<")):
            if getattr(self, key) is not None:
                parts.append(f"{op} {getattr(self, key):g}")
        if self.choices:
            parts.append("one of " + ", ".join(self.choices))
        if self.kind and _is_tuner_kind(self.kind):
            parts.append(_tuner_range(self.kind).describe())
        elif self.kind:
            parts.append("a known " + self.kind.replace("_", " "))
        if self.unique:
            parts.append("no item twice")
        return ", ".join(parts)


def _is_tuner_kind(kind: str) -> bool:
    from rlq.experiments.tuner_space import SETTING_RANGES, TUNER_KIND_PREFIX

    return kind.startswith(TUNER_KIND_PREFIX) and kind[len(TUNER_KIND_PREFIX) :] in SETTING_RANGES


def _tuner_range(kind: str) -> Any:
    from rlq.experiments.tuner_space import SETTING_RANGES, TUNER_KIND_PREFIX

    return SETTING_RANGES[kind[len(TUNER_KIND_PREFIX) :]]


def _known_kind(text: str) -> str:
    if text not in KINDS and not _is_tuner_kind(text):
        raise KeyError(text)
    return text


def _flag(word: str) -> Callable[[str], bool]:
    """Return the reader of a key whose only value is ``word`` (e.g. ``unique: yes``)."""

    def read(text: str) -> bool:
        if text != word:
            raise KeyError(text)
        return True

    return read


_READERS: dict[str, Callable[[str], Any]] = {
    "min": float,
    "max": float,
    "gt": float,
    "lt": float,
    "choices": lambda text: tuple(c.strip() for c in text.split("|") if c.strip()),
    "items": ITEM_TYPES.__getitem__,
    "min_len": int,
    "kind": _known_kind,
    "nonfinite": _flag("ok"),
    "unique": _flag("yes"),
}
"""How each constraint key's text becomes its :class:`Constraint` field (KeyError or ValueError: unreadable)."""


def parse_constraint(comment: str, where: str) -> Constraint:
    """Return the constraint declared at the end of a parameter's ``comment`` (none declared: no bounds)."""
    found = _BRACKET.search(comment)
    if not found:
        return Constraint()
    fields: dict[str, Any] = {}
    for pair in found.group(1).split(","):
        key, _, text = (part.strip() for part in pair.partition(":"))
        if key not in _READERS:
            raise ConstraintError(f"{where}: unknown constraint key {key!r} in [{found.group(1).strip()}]")
        try:
            fields[key] = _READERS[key](text)
        except (KeyError, ValueError):
            raise ConstraintError(f"{where}: cannot read constraint {pair.strip()!r}") from None
    return Constraint(**fields)


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    return False


def _default_item_type(default: Any) -> type | None:
    if not isinstance(default, list) or not default:
        return None
    kinds = {type(v) for v in default}
    return kinds.pop() if len(kinds) == 1 and kinds <= set(ITEM_TYPES.values()) else None


def _type_ok(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _check_scalar(name: str, value: Any, c: Constraint) -> None:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    bounds = (("min", ">=", lambda v, b: v >= b), ("gt", ">", lambda v, b: v > b))
    bounds += (("max", "<=", lambda v, b: v <= b), ("lt", "<", lambda v, b: v < b))
    for key, op, ok in bounds:
        bound = getattr(c, key)
        if bound is not None and numeric and not ok(value, bound):
            raise ConstraintError(f"parameter {name!r} must be {op} {bound:g}, got {value!r}")
    if c.choices is not None and str(value) not in c.choices:
        raise ConstraintError(f"parameter {name!r} must be one of {', '.join(c.choices)}; got {value!r}")
    if c.kind == "env_id":
        from rlq.rl.envs import check_env_id

        try:
            check_env_id(value)
        except (ValueError, ImportError) as e:
            raise ConstraintError(f"parameter {name!r}: {e}") from None
    elif c.kind == "run":
        _check_run(name, value)
    elif c.kind is not None and _is_tuner_kind(c.kind):
        try:
            _tuner_range(c.kind).check(name, value)
        except ValueError as e:
            raise ConstraintError(f"parameter {name!r}: {e}") from None
    elif c.kind == "algorithm":
        from rlq.rl.algorithms import check_algorithm_name

        try:
            check_algorithm_name(value)
        except ValueError as e:
            raise ConstraintError(f"parameter {name!r}: {e}") from None


def check_value(name: str, value: Any, default: Any, constraint: Constraint) -> None:
    """Raise ConstraintError naming ``name`` when ``value`` breaks ``constraint`` or holds NaN/infinity."""
    if not constraint.nonfinite and _non_finite(value):
        raise ConstraintError(
            f"parameter {name!r} must be finite, got {value!r} (NaN and infinity are not meaningful here)"
        )
    if value is None:
        return
    if isinstance(value, list):
        item_type = constraint.items or _default_item_type(default)
        if constraint.min_len is not None and len(value) < constraint.min_len:
            raise ConstraintError(
                f"parameter {name!r} needs at least {constraint.min_len} item(s), got {value!r}"
            )
        repeated = sorted({repr(v) for i, v in enumerate(value) if v in value[:i]})
        if constraint.unique and repeated:
            raise ConstraintError(
                f"parameter {name!r} must not repeat an item, got {value!r} ({', '.join(repeated)} twice)"
            )
        for i, item in enumerate(value):
            if item_type is not None and not _type_ok(item, item_type):
                raise ConstraintError(
                    f"parameter {name!r}: item {i} ({item!r}) is not a {item_type.__name__} like the others"
                )
            _check_scalar(f"{name}[{i}]", item, constraint)
        return
    _check_scalar(name, value, constraint)


def _check_run(name: str, run: Any) -> None:
    """Raise ConstraintError naming ``name`` unless ``run`` is ``[algorithm, env_id, steps(, hyperparams)]``.

    ``steps`` may be ``"zoo"`` (rl-zoo3's budget and settings) and the 4th item ``"zoo"`` after explicit
    steps (the zoo's settings); then the zoo must tune that pair (:func:`rlq.rl.zoo.zoo_hyperparams`).
    """
    if not isinstance(run, list) or len(run) not in (3, 4):
        raise ConstraintError(
            f'parameter {name!r} must be [algorithm, environment id, training steps or "zoo"] with optional '
            f'hyperparameters (a dict, or "zoo") as a 4th item, got {run!r}'
        )
    algorithm, env_id, steps = run[:3]
    extra = run[3] if len(run) == 4 else {}
    if steps != "zoo" and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ConstraintError(
            f'parameter {name!r}: training steps must be a positive int or "zoo", got {steps!r}'
        )
    if not isinstance(extra, dict) and not (extra == "zoo" and steps != "zoo"):
        raise ConstraintError(
            f'parameter {name!r}: hyperparameters must be a dict (or "zoo" after explicit steps), got {extra!r}'
        )
    for kind, value in (("algorithm", algorithm), ("env_id", env_id)):
        if not isinstance(value, str):
            raise ConstraintError(f"parameter {name!r}: the {kind} must be a string, got {value!r}")
        _check_scalar(name, value, Constraint(kind=kind))
    if "zoo" in (steps, extra):
        from rlq.rl.zoo import zoo_entry

        try:
            zoo_entry(algorithm, env_id)
        except (ValueError, ImportError) as e:
            raise ConstraintError(f"parameter {name!r}: {e}") from None
