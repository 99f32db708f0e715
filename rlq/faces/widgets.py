"""Interactive sparsity tuning in JupyterLab: compress a copy of a trained policy, evaluate it, plot live.

:class:`SparsityTuner` is a plain Python object holding ipywidgets controls and the explored points.
Moving a control evaluates a compressed copy of the policy in a worker thread, one seeded episode at a
time, so the UI stays responsive, shows progress and can cancel. Code calls :meth:`SparsityTuner.evaluate`
or :meth:`SparsityTuner.sweep` instead of moving controls. The figures (``tuner.figures``, plain Plotly
figures) are redrawn from the explored points after every change and shown through ``ipywidgets.Output``
(:mod:`rlq.faces.tuner_figures` says why not ``FigureWidget``), so a page reload or a second
``display(tuner)`` shows every point explored. Every range comes from
:data:`rlq.experiments.tuner_space.SETTING_RANGES`.
"""

from __future__ import annotations

import html
import threading
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from torch import nn

from rlq.compress import block_circulant_, compression_ratio, layer_report, magnitude_prune_
from rlq.experiments.paths import default_runs_dir
from rlq.experiments.tuner_space import METHODS, SETTING_RANGES, TunerSettings
from rlq.faces import tuner_figures as figs
from rlq.faces.tuner_training import TunerTraining
from rlq.rl.evaluate import evaluate
from rlq.sb3.networks import copy_policy, named_layers

__all__ = ["METHODS", "SETTING_RANGES", "SparsityTuner", "TunerSettings", "compress_policy"]

_DESCRIPTIONS = {
    "method": "method",
    "block_size": "block size B",
    "sparsity": "sparsity",
    "s_shift": "S_shift (training)",
    "bits": "bits",
}
_CONTROL_STYLE = {"description_width": "130px"}
_COLUMN = "400px"
STATUS_CLASS = "rlq-tuner-status"
"""CSS class of the status line (the point the star marks), for a page's scripts and tests."""


def _bits_spec(bits: int) -> int | str | None:
    """Return ``bits`` as :func:`rlq.quant.size_report` counts it: fp32, fp16, or integer codes."""
    return None if bits == 32 else "fp16" if bits == 16 else bits


def _precision(bits: int) -> str:
    """Return the :func:`rlq.quant.ptq` precision of ``bits`` < 32: fp16, else simulated integer weights
    (``sim8`` at 8 bits: weights only, as every other width, not ``int8``'s kernels that quantize
    activations too)."""
    return "fp16" if bits == 16 else "sim8" if bits == 8 else f"int{bits}"


def compress_policy(policy: nn.Module, settings: TunerSettings) -> dict[str, Any]:
    """Return a compressed copy of an SB3 policy with its measures (the original is left untouched).

    Keys: ``policy`` (what acts: the compressed copy, or at ``bits`` < 32 a
    :class:`rlq.sb3.quantized.QuantizedPolicy` of its action path, with SB3's ``predict``), ``layers``
    (per-layer report), ``compression_ratio`` (values stored), ``bits_per_weight``, ``stored_bytes`` and
    ``dense_bytes`` (as :func:`rlq.quant.size_report` counts a real export: values at ``bits``, sparse
    indices and scales). Quantization is applied last, to the compressed weights: fp16 as a cast, other
    widths as simulated symmetric integer weights with one scale per output row. A scale per layer would
    let the layer's largest weight set the step for all of it: at 4 bits that rounds most of a trained
    layer's weights to zero (about two thirds of the hidden actor layer of the tuner notebook's quick SAC
    agent), and pruning fewer than those would change nothing the policy computes.
    """
    from rlq.quant import size_report
    from rlq.sb3.quantized import quantized_policy

    compressed = copy_policy(policy)
    layers = list(named_layers(compressed, settings.skip_first_last))
    if settings.method in ("block_circulant", "gst"):
        block_circulant_(
            compressed, settings.block_size, skip_first_last=False, networks=[[n] for n in layers]
        )
    if settings.method in ("pruning", "gst") and settings.sparsity > 0:
        magnitude_prune_(compressed, settings.sparsity, layers=layers)
    storage = size_report(compressed, _bits_spec(settings.bits), per_channel=True)
    dense, total_bits = sum(r["dense"] for r in storage), sum(r["total_bits"] for r in storage)
    measures = {
        "layers": layer_report(compressed),
        "compression_ratio": compression_ratio(compressed),
        "bits_per_weight": total_bits / dense,
        "stored_bytes": total_bits / 8,
        "dense_bytes": dense * 4,
    }
    acting: Any = compressed
    if settings.bits < 32:
        acting = quantized_policy(compressed, _precision(settings.bits), per_channel_linear=True)
    return {"policy": acting, **measures}


def _control(name: str, value: Any) -> widgets.Widget:
    """Return the control of one ranged setting, its options or bounds read from SETTING_RANGES."""
    allowed = SETTING_RANGES[name]
    common = dict(
        value=value, description=_DESCRIPTIONS[name], style=_CONTROL_STYLE, layout={"width": "380px"}
    )
    if allowed.choices is not None:
        return widgets.Dropdown(options=allowed.choices, **common)
    # continuous_update=False: a drag evaluates the value where the slider is let go, not every value passed
    return widgets.FloatSlider(
        min=allowed.min, max=allowed.max, step=allowed.step, continuous_update=False, **common
    )


class SparsityTuner:
    """Controls and live figures to explore compression settings of a trained SB3 agent.

    ``model`` is any SB3 algorithm (its ``policy`` is compressed, never changed); every change of a
    control evaluates a compressed copy on ``n_episodes`` seeded episodes and adds a point to the
    return-vs-bits figure, unless an earlier point has the same evaluated settings
    (:meth:`TunerSettings.evaluated`), which then becomes the current one. ``settings`` are the controls'
    first values. "Train with these settings" trains as ``training`` says (:class:`TunerTraining`: steps,
    hyperparameters, the dense reference curve, the runs folder); the cancel button stops it, as it stops an
    evaluation.
    """

    def __init__(
        self,
        model: Any,
        env_id: str,
        n_episodes: int = 3,
        seed: int = 0,
        auto: bool = True,
        settings: TunerSettings | None = None,
        training: TunerTraining | None = None,
    ):
        training = TunerTraining() if training is None else training
        self.model, self.env_id, self.n_episodes, self.seed = model, env_id, n_episodes, seed
        self.train_steps, self.hyperparams = training.steps, dict(training.hyperparams)
        self.runs_dir = Path(training.runs_dir) if training.runs_dir is not None else default_runs_dir()
        self.reference_curve = training.reference_curve
        self.points: list[dict[str, Any]] = []
        self.current: int | None = None
        self.error: BaseException | None = None
        self.trained: list[Path] = []
        self.train_error: BaseException | None = None
        self.training_returns: list[tuple[int, float]] = []
        self.training_compression: list[tuple[int, float]] = []
        self.training_final: tuple[int, float, int] | None = None
        self.training_label = ""
        self.status_text = ""
        self._worker: threading.Thread | None = None
        self._trainer: threading.Thread | None = None
        self._cancel = threading.Event()
        self.train_cancel = threading.Event()
        self._evaluating = self._training = self._moving_controls = False
        self._lock = threading.RLock()
        first = asdict(settings or TunerSettings())
        self.controls = {name: _control(name, first[name]) for name in SETTING_RANGES}
        self.controls["skip_first_last"] = widgets.Checkbox(
            value=first["skip_first_last"], description="keep first and last layers dense", indent=False
        )
        self._build_status_widgets()
        self.views = {
            "reward": figs.FigureView(figs.REWARD_SIZE),
            "layers": figs.FigureView(figs.LAYER_SIZE),
            "size": figs.FigureView(figs.SIZE_SIZE),
            "training": figs.FigureView(figs.TRAINING_SIZE),
        }
        self._redraw()
        self.redraw_training()
        self.auto = auto
        for control in self.controls.values():
            control.observe(self._on_change, names="value")

    def _build_status_widgets(self) -> None:
        self.progress = widgets.IntProgress(
            min=0,
            max=self.n_episodes,
            description="evaluating",
            style=_CONTROL_STYLE,
            layout={"width": "270px"},
        )
        self.cancel_button = widgets.Button(description="cancel", disabled=True, layout={"width": "100px"})
        self.cancel_button.on_click(lambda _: self.cancel_all())
        # an HTML widget wraps its text (a Label cuts it off); the height only reserves room, it never clips
        self.status = widgets.HTML(layout={"width": "380px", "min_height": "5.5em"})
        self.status.add_class(STATUS_CLASS)
        self.train_button = widgets.Button(
            description="train with these settings", button_style="primary", layout={"width": "380px"}
        )
        self.train_button.on_click(lambda _: self.start_training())
        self.train_progress = widgets.IntProgress(
            min=0,
            max=self.train_steps,
            description="training",
            style=_CONTROL_STYLE,
            layout={"width": "380px"},
        )

    # ----- display
    @property
    def figures(self) -> dict[str, go.Figure]:
        """Return the figures as shown now: ``reward``, ``layers``, ``size`` and ``training``."""
        return {name: view.figure for name, view in self.views.items()}

    def widget(self) -> widgets.Widget:
        """Return the whole tuner as one widget for ``display`` (each call shows the same figures)."""
        controls = widgets.VBox(
            [
                *self.controls.values(),
                widgets.HBox([self.progress, self.cancel_button]),
                self.status,
                self.train_button,
                self.train_progress,
            ],
            layout=widgets.Layout(width=_COLUMN, min_width=_COLUMN),
        )
        return widgets.VBox(
            [
                widgets.HBox([controls, self.views["reward"].output]),
                widgets.HBox([self.views["layers"].output, self.views["size"].output]),
                self.views["training"].output,
            ]
        )

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

    def _redraw(self) -> None:
        with self._lock:
            point = self.points[self.current] if self.current is not None else None
            self.views["reward"].show(figs.reward_figure(self.points, self.current))
            self.views["layers"].show(figs.layer_figure(point))
            self.views["size"].show(figs.size_figure(point))

    def redraw_training(self) -> None:
        """Redraw the learning-curve figure from the training returns and compression recorded so far."""
        fig = figs.training_figure(
            self.reference_curve,
            self.training_returns,
            self.training_compression,
            self.training_label,
            self.training_final,
        )
        self.views["training"].show(fig)

    def show_status(self, text: str) -> None:
        """Show ``text`` (plain text) in the status line, wrapped within the controls' column."""
        self.status_text = text
        # ipywidgets gives HTML a line height of a whole control: normal lines, and long paths may break
        style = "line-height: 1.35; white-space: normal; overflow-wrap: anywhere; padding: 2px 0"
        self.status.value = f'<div style="{style}">{html.escape(text)}</div>'

    def _update_buttons(self) -> None:
        busy = self._evaluating or self._training
        self.progress.bar_style = "info" if self._evaluating else ""
        if not self._evaluating:
            self.progress.value = 0
        self.cancel_button.disabled = not busy
        self.cancel_button.button_style = "warning" if busy else ""
        self.train_button.disabled = self._training

    def _show_point(self, point: dict[str, Any], again: bool = False) -> None:
        text = (
            f"{point['label']}: return {point['mean_return']:.1f}, {point['bits_per_weight']:.2f} bits per weight "
            f"(compression ratio {point['compression_ratio']:.1%}), {point['stored_bytes'] / 1024:.2f} KiB"
        )
        self.show_status(text + (" (explored before)" if again else ""))

    # ----- settings and evaluation
    def settings(self) -> TunerSettings:
        """Return the settings the controls show now."""
        return TunerSettings(**{name: control.value for name, control in self.controls.items()})

    def _on_change(self, change: dict[str, Any]) -> None:
        if self.auto and not self._moving_controls:
            self.start()

    def _move_controls(self, settings: TunerSettings) -> None:
        """Set the controls to ``settings`` without evaluating anything (they follow code's evaluations)."""
        self._moving_controls = True
        try:
            for name, value in asdict(settings).items():
                self.controls[name].value = value
        finally:
            self._moving_controls = False

    def start(self) -> None:
        """Start evaluating the current settings in the background, cancelling an evaluation in progress."""
        self.cancel()
        self._cancel = threading.Event()
        settings = self.settings()
        self._worker = threading.Thread(target=self._run, args=(settings, self._cancel), daemon=True)
        self._worker.start()

    def cancel(self) -> None:
        """Ask the running evaluation to stop after its current episode, and wait for it (training goes on)."""
        self._cancel.set()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join()

    def cancel_all(self) -> None:
        """Stop the running evaluation and the running training, as the cancel button does."""
        self.cancel_training()
        self.cancel()

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Return the current point after the running evaluation (if any) has finished."""
        if self._worker is not None:
            self._worker.join(timeout)
        if self.error is not None:
            raise RuntimeError("the last evaluation failed") from self.error
        return self.points[self.current] if self.current is not None else None

    def evaluate(self, settings: TunerSettings | None = None) -> dict[str, Any]:
        """Return the point of ``settings`` (default: the controls'), evaluated now unless explored before.

        The point becomes the current one (the star and the status line) and the controls move to
        ``settings``, as if a person had moved them there: after any sweep the controls show the setting
        the star marks, and "train with these settings" trains it.
        """
        self.cancel()
        self._cancel = threading.Event()
        self._worker = None
        settings = settings or self.settings()
        self._move_controls(settings)
        self._run(settings, self._cancel)
        if self.error is not None:
            raise RuntimeError(f"evaluating {settings} failed") from self.error
        return self.points[self.current]

    def sweep(self, settings: list[TunerSettings]) -> pd.DataFrame:
        """Return the explored points after evaluating each of ``settings`` in turn (see :meth:`evaluate`)."""
        for one in settings:
            self.evaluate(one)
        return self.explored()

    def evaluate_settings(
        self, settings: TunerSettings, cancel: threading.Event | None = None
    ) -> dict[str, Any] | None:
        """Return a new point for ``settings`` (None when cancelled), evaluated episode by episode."""
        compressed = compress_policy(self.model.policy, settings)
        returns = []
        self.progress.max, self.progress.value = self.n_episodes, 0
        for i in range(self.n_episodes):
            if cancel is not None and cancel.is_set():
                self.show_status("cancelled")
                return None
            returns.extend(
                evaluate(compressed["policy"], self.env_id, n_episodes=1, seed=self.seed + i).returns
            )
            self.progress.value = i + 1
        used = settings.evaluated()
        measures = {k: v for k, v in compressed.items() if k != "policy"}
        return {
            **asdict(used),
            "label": used.label(),
            "settings": used,
            "mean_return": sum(returns) / len(returns),
            "returns": returns,
            **measures,
        }

    def _find(self, settings: TunerSettings) -> int | None:
        used = settings.evaluated()
        return next((i for i, p in enumerate(self.points) if p["settings"] == used), None)

    def _run(self, settings: TunerSettings, cancel: threading.Event) -> None:
        self.error = None
        with self._lock:
            found = self._find(settings)
            if found is not None:  # same compressed policy, same seeded episodes: same point
                self.current = found
                self._show_point(self.points[found], again=True)
                self._redraw()
                return
        self._evaluating = True
        self._update_buttons()
        self.show_status("evaluating...")
        try:
            point = self.evaluate_settings(settings, cancel)
        except Exception as e:  # shown in the UI; wait() and evaluate() re-raise it
            self.error = e
            self.show_status(f"error: {type(e).__name__}: {e}")
            return
        finally:
            self._evaluating = False
            self._update_buttons()
        if point is None:
            return
        with self._lock:
            self.points.append(point)
            self.current = len(self.points) - 1
            self._show_point(point)
            self._redraw()

    def explored(self) -> pd.DataFrame:
        """Return the explored points as a table (one row per distinct evaluated setting); a setting the
        point's method ignores (a dense policy's sparsity and block size) is left empty."""
        hidden = ("layers", "returns", "settings")
        ignored = [{f.name for f in fields(TunerSettings)} - set(p["settings"].used()) for p in self.points]
        return pd.DataFrame(
            [
                {k: None if k in skip else v for k, v in p.items() if k not in hidden}
                for p, skip in zip(self.points, ignored, strict=True)
            ]
        )

    # ----- "train with these settings"
    def start_training(self) -> None:
        """Start a short training run with the current settings in the background (see :meth:`train`).

        While it runs the train button is disabled and the cancel button stops it (:meth:`cancel_training`).
        """
        if self._trainer is not None and self._trainer.is_alive():
            self.show_status("a training run is already going")
            return
        self.train_cancel = threading.Event()
        self._training = True  # before the thread starts: the buttons change at once
        self._update_buttons()
        self._trainer = threading.Thread(target=self._train_in_background, daemon=True)
        self._trainer.start()

    def cancel_training(self) -> None:
        """Ask the running training to stop at its next step; it saves a checkpoint, marked cancelled."""
        self.train_cancel.set()

    def wait_training(self, timeout: float | None = None) -> Path | None:
        """Return the newest training run folder after the running training (if any) has finished."""
        if self._trainer is not None:
            self._trainer.join(timeout)
        if self.train_error is not None:
            raise RuntimeError("the last training run failed") from self.train_error
        return self.trained[-1] if self.trained else None

    def _train_in_background(self) -> None:
        self.train_error = None
        try:
            self.train()
        except Exception as e:  # shown in the UI; wait_training() re-raises it
            self.train_error = e
            self.show_status(f"training error: {type(e).__name__}: {e}")

    def train(self, steps: int | None = None) -> Path:
        """Return the run folder of a new agent trained for ``steps`` with the current settings.

        See :func:`rlq.faces.tuner_training.train_with_settings`; the learning curve is drawn as it trains,
        and :meth:`cancel_training` stops it early.
        """
        from rlq.faces.tuner_training import train_with_settings

        if threading.current_thread() is not self._trainer:  # called directly, not by start_training
            self.train_cancel = threading.Event()
        self._training = True
        self._update_buttons()
        try:
            folder = train_with_settings(self, steps or self.train_steps)
        finally:
            self._training = False
            self._update_buttons()
        self.trained.append(folder)
        return folder
