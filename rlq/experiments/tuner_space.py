"""The sparsity tuner's search space, declared once: what each setting may be, and which settings a method uses.

:data:`SETTING_RANGES` is the one declaration of every range. :class:`TunerSettings` validates against it,
the tuner's controls (:mod:`rlq.faces.widgets`) take their options and slider bounds from it, and a notebook
parameter declared ``[kind: tuner.<setting>]`` (:mod:`rlq.experiments.constraints`) is checked against it
before a kernel starts, so ``rlq run`` refuses exactly what the tuner would refuse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

METHODS = ("none", "block_circulant", "pruning", "gst")
"""Compression methods: dense, block-circulant, magnitude pruning, GST's block-circulant vectors pruned."""


@dataclass(frozen=True)
class SettingRange:
    """The values one tuner setting takes: a tuple of choices, or a closed interval (with a slider step)."""

    choices: tuple[Any, ...] | None = None
    """The allowed values, in the order a dropdown offers them."""
    min: float | None = None
    """Smallest allowed value of an interval."""
    max: float | None = None
    """Largest allowed value of an interval."""
    step: float | None = None
    """The slider's step over the interval (values between steps are allowed from code)."""

    def describe(self) -> str:
        """Return the range in words, e.g. ``one of 2, 4, 8`` or ``in [0, 0.95]``."""
        if self.choices is not None:
            return "one of " + ", ".join(str(c) for c in self.choices)
        return f"in [{self.min:g}, {self.max:g}]"

    def check(self, name: str, value: Any) -> Any:
        """Return ``value`` if the range allows it, else raise ValueError naming ``name`` and the range."""
        if self.choices is not None:
            kind = type(self.choices[0])
            if isinstance(value, bool) is not (kind is bool) or not isinstance(value, kind):
                raise ValueError(f"{name} must be {self.describe()}, got {value!r}")
            if value not in self.choices:
                raise ValueError(f"{name} must be {self.describe()}, got {value!r}")
            return value
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not numeric or not math.isfinite(value) or not self.min <= value <= self.max:
            raise ValueError(f"{name} must be a number {self.describe()}, got {value!r}")
        return float(value)


SETTING_RANGES: dict[str, SettingRange] = {
    "method": SettingRange(choices=METHODS),
    # the B of GST's schedules; a layer whose sides B does not divide stays dense (rlq.compress.block_circulant_)
    "block_size": SettingRange(choices=(2, 4, 8)),
    # 0.95 keeps one weight in twenty: beyond it every agent tried here had collapsed
    "sparsity": SettingRange(min=0.0, max=0.95, step=0.05),
    "s_shift": SettingRange(min=0.0, max=1.0, step=0.25),
    # 32: fp32, 16: fp16, else simulated integer weights of that many bits, one scale per output row (rlq.quant.ptq)
    "bits": SettingRange(choices=(32, 16, 8, 6, 4, 3, 2)),
}
"""Every ranged setting of :class:`TunerSettings`, its allowed values (``skip_first_last`` is a bool)."""

TUNER_KIND_PREFIX = "tuner."
"""A notebook constraint ``[kind: tuner.bits]`` checks a parameter against ``SETTING_RANGES["bits"]``."""


def check_tuner_setting(name: str, value: Any) -> Any:
    """Return ``value`` if the tuner's setting ``name`` (a key of SETTING_RANGES) allows it, else raise ValueError."""
    if name not in SETTING_RANGES:
        raise KeyError(f"the tuner has no ranged setting {name!r}; it has {', '.join(SETTING_RANGES)}")
    return SETTING_RANGES[name].check(name, value)


@dataclass(frozen=True)
class TunerSettings:
    """One point of the tuner's search space (every range: :data:`SETTING_RANGES`)."""

    method: str = "gst"
    """``none``, ``block_circulant``, ``pruning`` (magnitude pruning) or ``gst`` (block-circulant, then its vectors pruned)."""
    block_size: int = 4
    """Block size B of block-circulant layers."""
    sparsity: float = 0.5
    """Fraction of stored values pruned by magnitude (of the weights, or of the B-vectors under GST)."""
    s_shift: float = 1.0
    """GST's S_shift, used by "train with these settings" (a static compression has no schedule)."""
    skip_first_last: bool = True
    """Keep each network's first and last layer dense."""
    bits: int = 32
    """Weight precision: 32 (fp32), 16 (fp16) or N for simulated N-bit integer weights (a scale per output row)."""

    def __post_init__(self) -> None:
        for name in SETTING_RANGES:
            check_tuner_setting(name, getattr(self, name))
        if not isinstance(self.skip_first_last, bool):
            raise ValueError(f"skip_first_last must be a bool, got {self.skip_first_last!r}")

    def used(self) -> dict[str, Any]:
        """Return the settings a static evaluation reads, by name, with the method it evaluates as.

        S_shift only schedules training; a method without pruning ignores the sparsity, one without
        block-circulant layers the block size; a sparsity of 0 prunes nothing (pruning is then dense, GST
        block-circulant); a dense network compresses no layer, so which layers are skipped does not matter.
        """
        method = self.method
        if self.sparsity == 0 and method in ("pruning", "gst"):
            method = "none" if method == "pruning" else "block_circulant"
        kept = {"method": method, "bits": self.bits}
        if method != "none":
            kept["skip_first_last"] = self.skip_first_last
        if method in ("block_circulant", "gst"):
            kept["block_size"] = self.block_size
        if method in ("pruning", "gst"):
            kept["sparsity"] = self.sparsity
        return kept

    def evaluated(self) -> TunerSettings:
        """Return the settings a static evaluation actually uses (:meth:`used`), the ignored ones at their
        defaults. Two settings with equal ``evaluated()`` give the same compressed policy and seeded returns.
        """
        default = {f.name: f.default for f in fields(self)}
        kept = self.used()
        unused = {name: value for name, value in default.items() if name not in kept}
        return replace(self, **unused, **kept)

    def label(self) -> str:
        """Return the settings a static evaluation uses, in words, e.g. ``pruning s=0.80, 4 bit``."""
        used = self.evaluated()
        parts = [used.method]
        if used.method in ("block_circulant", "gst"):
            parts.append(f"B={used.block_size}")
        if used.method in ("pruning", "gst"):
            parts.append(f"s={used.sparsity:.2f}")
        text = " ".join(parts) + f", {used.bits} bit"
        return text + ("" if used.skip_first_last or used.method == "none" else ", all layers")
