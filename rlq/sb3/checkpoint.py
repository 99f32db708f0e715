"""Save and load Stable-Baselines3 models whose policy is compressed (block-circulant or pruned layers).

``model.save()`` followed by ``TD3.load()`` fails for a compressed policy: ``load`` rebuilds a dense
policy and rejects a state dict holding ``parametrizations.weight.original`` or ``weight_orig`` /
``weight_mask`` keys. :func:`save_compressed` therefore writes SB3's own zip with two views of the model:

- SB3's entries hold a *dense-equivalent* model: ``policy.pth`` has every compressed weight expanded and
  masked (the same function), and the optimizers of the policy are saved without their per-parameter
  state (Adam moments of B-vectors do not fit dense weights). Plain ``TD3.load(path)`` therefore works and
  gives a dense model computing the same actions, e.g. to evaluate or quantize it elsewhere.
- ``rlq/policy.pt`` and ``rlq/optimizers/<name>.pt`` hold the compressed policy's own state dict and the
  optimizers' full state; ``rlq/state.json`` holds the state of stateful callbacks (a GST schedule, its
  reward controller and history) when they are given. SB3's loader ignores these entries.

:func:`load_compressed` loads the dense-equivalent model with SB3's ``load``, re-applies the compression
structure read from ``rlq/policy.pt`` (:func:`rlq.compress.load_compressed_state_dict_`), loads the
compressed values and the optimizers' state, and restores the given callbacks. Every transform keeps
Parameter objects, so the optimizers SB3 builds for the dense policy hold the compressed parameters in the
same order as when they were saved, and their state loads index by index.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlq.compress import expand_circulant, is_block_circulant, load_compressed_state_dict_
from rlq.compress.block_circulant import circulant_vectors, stored_target
from rlq.compress.layers import _is_compressible, compressible_layers
from rlq.compress.masks import mask_of
from rlq.core.jsonio import json_safe
from rlq.rl.checkpoints import KEEP_CHECKPOINTS
from rlq.rl.resume import Checkpoints

POLICY_ENTRY = "rlq/policy.pt"
OPTIMIZER_PREFIX = "rlq/optimizers/"
STATE_ENTRY = "rlq/state.json"
FORMAT_VERSION = 1


def is_compressed(policy: nn.Module) -> bool:
    """Return whether any layer of ``policy`` is block-circulant or pruned."""
    return any(
        is_block_circulant(layer) or mask_of(*stored_target(layer)) is not None
        for _, layer in compressible_layers(policy)
    )


def effective_weight(layer: nn.Module) -> torch.Tensor:
    """Return the dense weight a (possibly compressed) layer computes with, without autograd history."""
    with torch.no_grad():
        if is_block_circulant(layer):
            return expand_circulant(circulant_vectors(layer)).detach().clone()
        target, name = stored_target(layer)
        mask = mask_of(target, name)
        if mask is None:
            return layer.weight.detach().clone()
        return (target._parameters[f"{name}_orig"] * mask).detach().clone()


def dense_state_dict(policy: nn.Module) -> dict[str, torch.Tensor]:
    """Return the state dict a dense copy of ``policy`` computing the same function would have.

    Compressed layers contribute one dense ``<layer>.weight`` (B-vectors expanded, masks applied); every
    other entry is the policy's own. Shared modules appear under each of their names, as in ``state_dict``.
    """
    compressed = {
        name: layer
        for name, layer in policy.named_modules(remove_duplicate=False)
        if _is_compressible(layer)
        and (is_block_circulant(layer) or mask_of(*stored_target(layer)) is not None)
    }
    out: dict[str, torch.Tensor] = {}
    for key, value in policy.state_dict().items():
        layer_name, _, rest = key.rpartition(".")
        if layer_name in compressed and rest in ("weight_orig", "weight_mask"):
            continue
        if ".parametrizations.weight." in f".{key}":
            owner = (
                key.split(".parametrizations.weight.")[0] if not key.startswith("parametrizations.") else ""
            )
            if owner in compressed:
                continue
        out[key] = value
    for name, layer in compressed.items():
        out[f"{name}.weight" if name else "weight"] = effective_weight(layer)
    return out


def _torch_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def zip_path(path: str | Path, must_exist: bool) -> Path:
    """Return the zip file SB3's ``save(path)`` writes (it adds ``.zip`` to a bare name), checked to exist."""
    path = Path(path)
    if must_exist:
        if path.is_file():
            return path
        if path.suffix != ".zip" and path.with_name(path.name + ".zip").is_file():
            return path.with_name(path.name + ".zip")
        raise FileNotFoundError(f"no saved model at {path}")
    return path if path.suffix else path.with_name(path.name + ".zip")


def _policy_optimizer_names(model: Any, names: Sequence[str]) -> list[str]:
    """Return the names (as in SB3's ``get_parameters``) of the optimizers that train the policy's parameters."""

    def resolve(name: str) -> Any:
        obj = model
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    policy_params = {id(p) for p in model.policy.parameters()}
    found = []
    for name in names:
        obj = resolve(name)
        if isinstance(obj, torch.optim.Optimizer) and any(
            id(p) in policy_params for group in obj.param_groups for p in group["params"]
        ):
            found.append(name)
    return found


def _state_of(callbacks: Sequence[Any]) -> dict[str, Any]:
    states: dict[str, Any] = {}
    for callback in callbacks:
        key = getattr(callback, "checkpoint_key", None)
        if key is None or not hasattr(callback, "state_dict"):
            raise TypeError(
                f"{type(callback).__name__} has no checkpoint_key and state_dict(); it cannot be saved"
            )
        if key in states:
            raise ValueError(f"two callbacks share the checkpoint_key {key!r}")
        states[key] = callback.state_dict()
    return states


def save_compressed(model: Any, path: str | Path, callbacks: Sequence[Any] = ()) -> Path:
    """Return the path of a zip holding ``model`` with its compressed policy (and ``callbacks``' state).

    The file is SB3's own format (``path`` gets a ``.zip`` suffix when it has none, as with
    ``model.save``); see the module docstring for what it holds. ``callbacks`` are objects with a
    ``checkpoint_key`` and ``state_dict()`` (e.g. :class:`rlq.sb3.gst_callback.GSTCallback`).
    """
    path = zip_path(path, must_exist=False)
    states = _state_of(callbacks)
    params = model.get_parameters()
    policy_optimizers = _policy_optimizer_names(model, [n for n in params if n != "policy"])
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(buffer) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            stem = item.filename[: -len(".pth")] if item.filename.endswith(".pth") else None
            if stem == "policy":
                dst.writestr(item, _torch_bytes(dense_state_dict(model.policy)))
            elif stem in policy_optimizers:
                state = params[stem]
                dst.writestr(item, _torch_bytes({"state": {}, "param_groups": state["param_groups"]}))
            else:
                dst.writestr(item, src.read(item.filename))
        dst.writestr(POLICY_ENTRY, _torch_bytes(params["policy"]))
        for name in policy_optimizers:
            dst.writestr(f"{OPTIMIZER_PREFIX}{name}.pt", _torch_bytes(params[name]))
        meta = {"format": FORMAT_VERSION, "compressed": is_compressed(model.policy), "callbacks": states}
        dst.writestr(STATE_ENTRY, json.dumps(json_safe(meta), indent=1))
    tmp.replace(path)
    return path


def load_compressed(
    cls: type, path: str | Path, env: Any = None, callbacks: Sequence[Any] = (), **kwargs: Any
) -> Any:
    """Return the model saved by :func:`save_compressed`, its compression re-applied and its state loaded.

    ``cls`` is the SB3 algorithm class (``TD3``, ``PPO``, ...); ``env`` and ``kwargs`` go to
    ``cls.load``. Each of ``callbacks`` gets back the state saved under its ``checkpoint_key`` (a
    KeyError names a callback the file holds no state for). A plain SB3 file (no rlq entries) loads as
    ``cls.load`` would load it.
    """
    path = zip_path(path, must_exist=True)
    model = cls.load(path, env=env, **kwargs)
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        if POLICY_ENTRY not in names:
            if callbacks:
                raise KeyError(f"{path} holds no rlq state, so no callback state to restore")
            return model
        device = model.device
        policy_state = torch.load(
            io.BytesIO(archive.read(POLICY_ENTRY)), map_location=device, weights_only=True
        )
        load_compressed_state_dict_(model.policy, policy_state)
        for entry in sorted(n for n in names if n.startswith(OPTIMIZER_PREFIX)):
            name = entry[len(OPTIMIZER_PREFIX) : -len(".pt")]
            optimizer = model
            for part in name.split("."):
                optimizer = getattr(optimizer, part)
            optimizer.load_state_dict(
                torch.load(io.BytesIO(archive.read(entry)), map_location=device, weights_only=True)
            )
        meta = json.loads(archive.read(STATE_ENTRY)) if STATE_ENTRY in names else {}
    states = meta.get("callbacks", {})
    for callback in callbacks:
        key = getattr(callback, "checkpoint_key", None)
        if key not in states:
            raise KeyError(f"{path} holds no state for callback {key!r}; it holds {sorted(states)}")
        callback.load_state_dict(states[key])
    return model


def saved_callback_states(path: str | Path) -> dict[str, Any]:
    """Return the callback states stored in a file written by :func:`save_compressed` ({} if none)."""
    path = zip_path(path, must_exist=True)
    with zipfile.ZipFile(path) as archive:
        if STATE_ENTRY not in archive.namelist():
            return {}
        return json.loads(archive.read(STATE_ENTRY)).get("callbacks", {})


def save_dense_actor(model: Any, path: str | Path) -> Path:
    """Return ``path`` after writing the dense-equivalent weights of ``model``'s actor (``model.policy.actor``).

    A compressed NumPy archive (``.npz``) of :func:`dense_state_dict` of the actor alone: compressed layers
    as their dense weights with the pruned entries zero, so the file is small where the actor is sparse
    (about 0.1 MB for TD3's 400-300 actor at 84% compression, against 6 MB for the whole agent of
    :func:`save_compressed`). It holds what deploying the actor needs and nothing to train on:
    :func:`load_dense_actor` puts it into a new model of the same algorithm and networks.
    """
    path = Path(path)
    state = {key: value.detach().cpu().numpy() for key, value in dense_state_dict(model.policy.actor).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        np.savez_compressed(handle, **state)
    tmp.replace(path)
    return path


def load_dense_actor(model: Any, path: str | Path) -> Any:
    """Return ``model`` after loading the actor weights :func:`save_dense_actor` wrote into ``model.policy.actor``.

    ``model`` is a new model of the algorithm and networks that saved them (e.g. from
    :func:`rlq.rl.agents.make_model`); a file whose entries or shapes differ from its actor's raises, naming
    the file. The actor then computes the saved one's actions; its target network and critics stay as built.
    """
    path = Path(path)
    with np.load(path) as archive:
        state = {key: torch.from_numpy(archive[key]) for key in archive.files}
    try:
        model.policy.actor.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ValueError(f"{path}: its weights do not fit this model's actor: {error}") from None
    return model


class CompressedCheckpoints(Checkpoints):
    """:class:`rlq.rl.resume.Checkpoints` whose models are saved with :func:`save_compressed` and loaded with
    :func:`load_compressed`: what a training with GST, pruning or another compression callback needs (a plain
    model saves and loads as SB3's own)."""

    def __init__(
        self, folder: str | Path, every: int = 0, *, keep: int = KEEP_CHECKPOINTS, label: str | None = None
    ):
        super().__init__(
            folder, every, keep=keep, save_model=save_compressed, load_model=load_compressed, label=label
        )
