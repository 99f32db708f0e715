"""Interactive sparsity tuning in JupyterLab: compress a copy of a trained policy, evaluate it, plot live.

:class:`SparsityTuner` is a plain Python object holding ipywidgets controls and Plotly ``FigureWidget``s,
so a test can drive it from Python (set ``tuner.controls["sparsity"].value``, call :meth:`wait`, read
``tuner.figures``) exactly as a person drives it with the mouse. Evaluations run in a worker thread, one
seeded episode at a time, so the UI stays responsive, shows progress and can cancel.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from stable_baselines3.common.callbacks import BaseCallback
from torch import nn

from rlq.compress import block_circulant_, compression_ratio, layer_report, magnitude_prune_
from rlq.experiments.paths import default_runs_dir
from rlq.experiments.runs import new_run_dir, utc_stamp, write_json
from rlq.rl.episodes import finished_episodes
from rlq.rl.evaluate import evaluate
from rlq.sb3.networks import copy_policy, named_layers

METHODS = ("none", "block_circulant", "pruning", "gst")
BLOCK_SIZES = (2, 4, 8)
BITS = (32, 16, 8, 6, 4, 3, 2)


@dataclass(frozen=True)
class TunerSettings:
    """One point of the tuner's search space."""

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
    """Weight precision: 32 (fp32), 16 (fp16) or N for simulated N-bit integer weights."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        if not 0.0 <= self.sparsity < 1.0:
            raise ValueError(f"sparsity must be in [0, 1), got {self.sparsity}")
        if self.bits not in (32, 16) and not 2 <= self.bits <= 16:
            raise ValueError(f"bits must be 32, 16 or in 2..16, got {self.bits}")


def compress_policy(
    policy: nn.Module, settings: TunerSettings
) -> tuple[nn.Module, list[dict[str, Any]], float]:
    """Return a compressed copy of an SB3 policy, its per-layer report and its compression ratio.

    The original policy is left untouched. Quantization (``bits`` < 32) is applied last, to the
    compressed weights, through :func:`rlq.quant.ptq`.
    """
    compressed = copy_policy(policy)
    layers = list(named_layers(compressed, settings.skip_first_last))
    if settings.method in ("block_circulant", "gst"):
        block_circulant_(
            compressed, settings.block_size, skip_first_last=False, networks=[[n] for n in layers]
        )
    if settings.method in ("pruning", "gst") and settings.sparsity > 0:
        magnitude_prune_(compressed, settings.sparsity, layers=layers)
    report = layer_report(compressed)
    ratio = compression_ratio(compressed)
    if settings.bits < 32:
        from rlq.quant import ptq

        compressed = ptq(compressed, "fp16" if settings.bits == 16 else f"int{settings.bits}")
    return compressed, report, ratio


def stored_weight_bytes(report: list[dict[str, Any]], bits: int) -> dict[str, float]:
    """Return the weights' size in bytes, dense fp32 and as stored (kept values at ``bits`` bits each)."""
    dense = sum(row["dense"] for row in report) * 4
    stored = sum(row["stored"] for row in report) * bits / 8
    return {"dense_bytes": dense, "stored_bytes": stored}


class SparsityTuner:
    """Controls and live figures to explore compression settings of a trained SB3 agent.

    ``model`` is any SB3 algorithm (its ``policy`` is compressed, never changed); every change of a
    control evaluates a compressed copy on ``n_episodes`` seeded episodes and adds a point to the
    reward-vs-compression figure.
    """

    def __init__(
        self,
        model: Any,
        env_id: str,
        n_episodes: int = 3,
        seed: int = 0,
        auto: bool = True,
        train_steps: int = 20_000,
        runs_dir: str | Path | None = None,
    ):
        self.model, self.env_id, self.n_episodes, self.seed = model, env_id, n_episodes, seed
        self.train_steps, self.runs_dir = (
            train_steps,
            Path(runs_dir) if runs_dir is not None else default_runs_dir(),
        )
        self.trained: list[Path] = []
        self._trainer: threading.Thread | None = None
        self.points: list[dict[str, Any]] = []
        self._worker: threading.Thread | None = None
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.controls = {
            "method": widgets.Dropdown(options=METHODS, value="gst", description="method"),
            "block_size": widgets.Dropdown(options=BLOCK_SIZES, value=4, description="block size"),
            "sparsity": widgets.FloatSlider(value=0.5, min=0.0, max=0.95, step=0.05, description="sparsity"),
            "s_shift": widgets.FloatSlider(value=1.0, min=0.0, max=1.0, step=0.25, description="S_shift"),
            "skip_first_last": widgets.Checkbox(value=True, description="skip first/last layers"),
            "bits": widgets.Dropdown(options=BITS, value=32, description="bits"),
        }
        self.progress = widgets.IntProgress(min=0, max=n_episodes, description="evaluating")
        self.cancel_button = widgets.Button(description="cancel", button_style="warning")
        self.status = widgets.Label()
        self.cancel_button.on_click(lambda _: self.cancel())
        self.train_button = widgets.Button(description="train with these settings", button_style="primary")
        self.train_progress = widgets.IntProgress(min=0, max=train_steps, description="training")
        self.train_button.on_click(lambda _: self.start_training())
        self.train_error: BaseException | None = None
        self.figures = {
            "reward": self._reward_figure(),
            "layers": self._layer_figure(),
            "size": self._size_figure(),
            "training": self._training_figure(),
        }
        self.auto = auto
        for control in self.controls.values():
            control.observe(self._on_change, names="value")

    # ----- figures
    def _reward_figure(self) -> go.FigureWidget:
        fig = go.FigureWidget()
        fig.add_scatter(x=[], y=[], mode="markers", name="explored", text=[])
        fig.add_scatter(x=[], y=[], mode="markers", name="current", marker=dict(size=14, symbol="star"))
        fig.update_layout(
            title="Reward vs compression ratio",
            xaxis_title="compression ratio",
            yaxis_title="mean return",
            template="plotly_white",
            height=350,
        )
        return fig

    def _layer_figure(self) -> go.FigureWidget:
        fig = go.FigureWidget()
        fig.add_bar(x=[], y=[], name="compression")
        fig.update_layout(
            title="Per-layer compression (1 - stored / dense)",
            yaxis_range=[0, 1],
            template="plotly_white",
            height=350,
        )
        return fig

    def _size_figure(self) -> go.FigureWidget:
        fig = go.FigureWidget()
        fig.add_bar(x=["dense fp32", "compressed"], y=[0, 0])
        fig.update_layout(title="Weights in bytes", template="plotly_white", height=300)
        return fig

    def _training_figure(self) -> go.FigureWidget:
        fig = go.FigureWidget()
        fig.add_scatter(x=[], y=[], mode="lines+markers", name="episode return")
        fig.add_scatter(x=[], y=[], mode="lines", name="compression ratio", yaxis="y2")
        fig.update_layout(
            title="Training with these settings",
            xaxis_title="environment steps",
            yaxis_title="episode return",
            template="plotly_white",
            height=300,
            yaxis2=dict(title="compression ratio", overlaying="y", side="right", range=[0, 1]),
        )
        return fig

    # ----- settings and evaluation
    def settings(self) -> TunerSettings:
        """Return the settings the controls show now."""
        return TunerSettings(**{name: control.value for name, control in self.controls.items()})

    def widget(self) -> widgets.Widget:
        """Return the whole tuner as one widget for ``display``."""
        controls = widgets.VBox(
            list(self.controls.values())
            + [
                widgets.HBox([self.progress, self.cancel_button]),
                self.status,
                widgets.HBox([self.train_button, self.train_progress]),
            ],
            layout=widgets.Layout(min_width="420px"),
        )
        return widgets.VBox(
            [
                widgets.HBox([controls, self.figures["reward"]]),
                widgets.HBox([self.figures["layers"], self.figures["size"]]),
            ]
        )

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

    def _on_change(self, change: dict[str, Any]) -> None:
        if self.auto:
            self.start()

    def start(self) -> None:
        """Start evaluating the current settings in the background, cancelling an evaluation in progress."""
        self.cancel()
        self._cancel = threading.Event()
        settings = self.settings()
        self._worker = threading.Thread(target=self._run, args=(settings, self._cancel), daemon=True)
        self._worker.start()

    def cancel(self) -> None:
        """Ask the running evaluation to stop after its current episode, and wait for it."""
        self._cancel.set()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join()

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Return the newest explored point after the running evaluation (if any) has finished."""
        if self._worker is not None:
            self._worker.join(timeout)
        if self.error is not None:
            raise RuntimeError("the last evaluation failed") from self.error
        return self.points[-1] if self.points else None

    def evaluate_settings(
        self, settings: TunerSettings, cancel: threading.Event | None = None
    ) -> dict[str, Any] | None:
        """Return the explored point for ``settings`` (None when cancelled), episode by episode."""
        policy, report, ratio = compress_policy(self.model.policy, settings)
        returns = []
        self.progress.max, self.progress.value = self.n_episodes, 0
        for i in range(self.n_episodes):
            if cancel is not None and cancel.is_set():
                self.status.value = "cancelled"
                return None
            returns.extend(evaluate(policy, self.env_id, n_episodes=1, seed=self.seed + i).returns)
            self.progress.value = i + 1
        size = stored_weight_bytes(report, settings.bits)
        point = {
            **asdict(settings),
            "compression_ratio": ratio,
            "mean_return": sum(returns) / len(returns),
            "returns": returns,
            **size,
            "layers": report,
        }
        return point

    def _run(self, settings: TunerSettings, cancel: threading.Event) -> None:
        self.error = None
        self.status.value = "evaluating..."
        try:
            point = self.evaluate_settings(settings, cancel)
        except Exception as e:  # shown in the UI; wait() re-raises it for code and tests
            self.error = e
            self.status.value = f"error: {type(e).__name__}: {e}"
            return
        if point is None:
            return
        with self._lock:
            self.points.append(point)
            self._update_figures(point)
        self.status.value = (
            f"return {point['mean_return']:.1f} at compression {point['compression_ratio']:.1%}, "
            f"{point['stored_bytes'] / 1024:.1f} KiB"
        )

    def _update_figures(self, point: dict[str, Any]) -> None:
        reward = self.figures["reward"]
        with reward.batch_update():
            reward.data[0].x = [p["compression_ratio"] for p in self.points]
            reward.data[0].y = [p["mean_return"] for p in self.points]
            reward.data[0].text = [
                f"{p['method']} B={p['block_size']} s={p['sparsity']:.2f} {p['bits']} bit"
                for p in self.points
            ]
            reward.data[1].x, reward.data[1].y = [point["compression_ratio"]], [point["mean_return"]]
        layers = self.figures["layers"]
        with layers.batch_update():
            layers.data[0].x = [row["name"] for row in point["layers"]]
            layers.data[0].y = [row["ratio"] for row in point["layers"]]
        self.figures["size"].data[0].y = [point["dense_bytes"], point["stored_bytes"]]

    def explored(self) -> pd.DataFrame:
        """Return the explored points as a table (one row per evaluation)."""
        return pd.DataFrame(
            [{k: v for k, v in p.items() if k not in ("layers", "returns")} for p in self.points]
        )

    # ----- "train with these settings"
    def start_training(self) -> None:
        """Start a short training run with the current settings in the background (see :meth:`train`)."""
        if self._trainer is not None and self._trainer.is_alive():
            self.status.value = "a training run is already going"
            return
        self._trainer = threading.Thread(target=self._train_in_background, daemon=True)
        self._trainer.start()

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
            self.status.value = f"training error: {type(e).__name__}: {e}"

    def train(self, steps: int | None = None) -> Path:
        """Return the run folder of a new agent trained for ``steps`` with the current settings.

        GST (or magnitude pruning, or dense) through :func:`rlq.experiments.gst.train_compressed`, with the tuner's
        block size, S_shift, target sparsity and skipped layers, on the tuner's algorithm and environment.
        The folder is a normal run folder: ``params.json``, ``results.json``, ``history.csv``, ``curve.csv``
        and checkpoints.
        """
        from rlq.experiments.gst import train_compressed

        steps = steps or self.train_steps
        settings = self.settings()
        algo = type(self.model).__name__
        method, gst, pruning = _training_method(settings)
        folder = new_run_dir(self.runs_dir, "sparsity_tuner_train")
        params = {
            "algorithm": algo,
            "env_id": self.env_id,
            "timesteps": steps,
            "seed": self.seed,
            "method": method,
            **asdict(settings),
        }
        write_json(folder / "params.json", params)
        write_json(
            folder / "results.json",
            {
                "status": "running",
                "experiment": "sparsity_tuner_train",
                "preset": None,
                "started": utc_stamp(),
            },
        )
        self.train_progress.max, self.train_progress.value = steps, 0
        self.status.value = f"training {algo} with {method} into {folder}"
        live = _LiveTraining(self, every=max(steps // 20, 1))
        run = train_compressed(
            method,
            algo,
            self.env_id,
            steps,
            seed=self.seed,
            n_envs=8 if algo in ("PPO", "A2C") else 1,
            run_dir=folder,
            checkpoint_every=max(steps // 2, 1),
            gst=gst,
            pruning=pruning,
            log_every=max(steps // 50, 1),
            callbacks=[live],
        )
        live.refresh(run.callback, run.curve)
        run.history.to_csv(folder / "history.csv", index=False)
        run.curve.to_csv(folder / "curve.csv", index=False)
        summary = run.summary()
        write_json(
            folder / "results.json",
            {
                "status": "ok",
                "experiment": "sparsity_tuner_train",
                "preset": None,
                "finished": utc_stamp(),
                **{k: v for k, v in summary.items() if k != "method"},
                "method": method,
            },
        )
        self.trained.append(folder)
        self.status.value = (
            f"trained: average compression {summary['avg_compression_ratio']:.1%}, "
            f"return {summary['final_train_return']:.1f}; saved in {folder}"
        )
        return folder


def _training_method(settings: TunerSettings) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """Return ``(method, gst settings, pruning settings)`` of train_compressed for the tuner's settings."""
    if settings.method == "none":
        return "dense", None, None
    if settings.method == "pruning":
        return (
            "pruning",
            None,
            {"final_sparsity": settings.sparsity, "skip_first_last": settings.skip_first_last},
        )
    gst = {
        "block_schedule": ((0.0, settings.block_size),),
        "s_shift": settings.s_shift,
        "skip_first_last": settings.skip_first_last,
    }
    if settings.method == "block_circulant":
        gst["bc_end"] = 1.0  # never handed over to pruning, and the pruning target never rises
        gst["s_shift"] = 1.0
    else:
        gst["sparsity"] = {"max_sparsity": settings.sparsity}
    return "gst", gst, None


class _LiveTraining(BaseCallback):
    """Update the tuner's training progress bar and figure while SB3 trains."""

    def __init__(self, tuner: SparsityTuner, every: int):
        super().__init__()
        self.tuner, self.every, self.returns = tuner, every, []

    def _on_step(self) -> bool:
        for episode_return, _ in finished_episodes(self.locals.get("infos")):
            self.returns.append((self.num_timesteps, episode_return))
        self.tuner.train_progress.value = min(self.num_timesteps, self.tuner.train_progress.max)
        if self.n_calls % self.every == 0:
            self.refresh(self._compression_callback(), None)
        return True

    def _compression_callback(self) -> Any:
        # train_agent hands learn() one flat CallbackList; the compression callback is a sibling of this one
        group = self.locals.get("callback")
        return next((c for c in getattr(group, "callbacks", []) if hasattr(c, "compression_ratio")), None)

    def refresh(self, compression: Any, curve: pd.DataFrame | None) -> None:
        """Redraw the training figure from the episode returns and the compression history so far."""
        fig = self.tuner.figures["training"]
        with fig.batch_update():
            if curve is not None and len(curve):
                fig.data[0].x, fig.data[0].y = list(curve["timestep"]), list(curve["episode_return"])
            elif self.returns:
                fig.data[0].x, fig.data[0].y = [s for s, _ in self.returns], [r for _, r in self.returns]
            if compression is not None and len(compression.history):
                history = compression.history
                fig.data[1].x, fig.data[1].y = list(history["step"]), list(history["compression_ratio"])
