"""Checkpoints of the original PyTorch TRM: its state_dict <-> our parameter dicts.

The mapping is pure NumPy. Only reading and writing the `.pt` file needs PyTorch (the optional `torch`
extra), imported when one of those two functions runs.

Original key (prefixes stripped)                    ours                                 layout
inner.embed_tokens.embedding_weight     [V, D]      params["embed_tokens"]               same
inner.embed_pos.embedding_weight        [S, D]      params["embed_pos"] (learned pos.)   same
inner.lm_head.weight, inner.q_head.*               params["lm_head"], ["q_head"]        Linear: [out, in]
inner.L_level.layers.{i}.<module>.<proj>.weight     params["layers"][i][module][proj]    Linear: [out, in]
inner.puzzle_emb.weights                [N, ndim]   puzzle_emb                           same, float32
inner.H_init, inner.L_init              [D]         buffers["H_init"], ["L_init"]        same, float32 (*)

PyTorch stores Linear weights [out_features, in_features]; ours are [in, out], so they are transposed.
Files written by the original trainer prefix every key with `_orig_mod.` (torch.compile) and `model.`
(the loss head); both are stripped on import and written back on export.

(*) The original keeps H_init/L_init in its forward dtype (bfloat16 in every recipe, float32 in a float32 run).
Import keeps the file's values (float32 holds bfloat16 exactly); export writes the run's forward dtype.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from trm.errors import UserError
from trm.model.config import DEFAULT_EXPORT_PREFIX, ModelConfig
from trm.model.trm import TRM, split_state

PREFIXES = ("_orig_mod.", "model.")
# Non-parameter buffers some versions of the original save; not needed for inference, ignored on import.
IGNORED_KEYS = (
    "inner.puzzle_emb.local_weights",
    "inner.puzzle_emb.local_ids",
    "inner.rotary_emb.cos_cached",
    "inner.rotary_emb.sin_cached",
)


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"layers": {0: {"mlp": {...}}}} -> {"layers.0.mlp....": leaf}."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _unflatten(flat: dict[str, Any], like: dict) -> dict:
    """Inverse of _flatten, following the key types (int layer indices) of `like`."""

    def build(node: dict, prefix: str) -> dict:
        return {
            key: build(value, f"{prefix}{key}.") if isinstance(value, dict) else flat[f"{prefix}{key}"]
            for key, value in node.items()
        }

    return build(like, "")


def _torch_key(ours: str) -> str:
    """Our flattened parameter name -> the original's key (without prefixes)."""
    if ours in ("embed_tokens", "embed_pos"):
        return f"inner.{ours}.embedding_weight"
    if ours.startswith("layers."):
        return f"inner.L_level.{ours}"
    return f"inner.{ours}"


def _is_linear_weight(ours: str, shape: tuple[int, ...]) -> bool:
    return ours.endswith(".weight") and len(shape) == 2


def parameter_templates(cfg: ModelConfig) -> tuple[dict, dict]:
    """(params, buffers) pure dicts of ShapeDtypeStructs for `cfg`, without computing any initial values."""
    abstract = nnx.eval_shape(lambda: TRM(cfg, rngs=nnx.Rngs(0)))
    _, params, _, buffers = split_state(abstract)
    return nnx.to_pure_dict(params), nnx.to_pure_dict(buffers)


def expected_state_dict(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Original key (prefixes stripped) -> (shape, dtype) of every tensor a TRM with `cfg` has."""
    params, buffers = parameter_templates(cfg)
    expected = {}
    for name, leaf in _flatten(params).items():
        shape = tuple(leaf.shape)
        expected[_torch_key(name)] = (shape[::-1] if _is_linear_weight(name, shape) else shape, np.float32)
    expected["inner.puzzle_emb.weights"] = ((cfg.num_puzzle_identifiers, cfg.puzzle_emb_dim), np.float32)
    for name, leaf in buffers.items():
        expected[f"inner.{name}"] = (tuple(leaf.shape), np.dtype(cfg.dtype))  # the original's forward dtype
    return expected


def strip_prefixes(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Remove the original trainer's `_orig_mod.` and `model.` key prefixes (each where present)."""
    stripped = {}
    for key, value in state_dict.items():
        name = key
        for prefix in PREFIXES:
            name = name.removeprefix(prefix)
        stripped[name] = value
    return stripped


def _describe_architecture(keys: set[str]) -> str | None:
    """Why a key set is not a TRM we support, or None if it looks like one."""
    if not any(k.startswith("inner.") for k in keys):
        sample = ", ".join(sorted(keys)[:3]) or "none"
        return f"no 'inner.' keys (found e.g. {sample}): not a TRM state_dict"
    if any(k.startswith("inner.H_level.") for k in keys):
        return "keys 'inner.H_level.*' belong to HRM (two modules), not TRM (one shared L_level)"
    return None


def state_dict_to_params(
    state_dict: dict[str, np.ndarray], cfg: ModelConfig, source: str
) -> tuple[dict, np.ndarray, dict]:
    """An original state_dict (NumPy arrays, prefixes stripped or not) -> (params, puzzle_emb, buffers).

    Every key and shape is checked against the architecture `cfg`; a UserError names the first missing,
    unexpected or wrongly shaped key (and `source`, the file). Every value becomes float32, which holds
    bfloat16 and float32 exactly: H_init/L_init keep the file's values whatever its forward dtype was.
    """
    tensors = strip_prefixes(state_dict)
    expected = expected_state_dict(cfg)
    present = set(tensors) - set(IGNORED_KEYS)
    problem = _describe_architecture(present)
    if problem:
        raise UserError(f"{source}: unknown architecture: {problem}")
    arch = f"arch.mlp_t={str(cfg.mlp_t).lower()}, arch.L_layers={cfg.L_layers}, arch.pos_encodings={cfg.pos_encodings}"
    missing = sorted(set(expected) - present)
    if missing:
        raise UserError(f"{source}: missing key {missing[0]!r} for the architecture of the config ({arch})")
    unexpected = sorted(present - set(expected))
    if unexpected:
        raise UserError(
            f"{source}: unexpected key {unexpected[0]!r}: not part of the architecture of the config ({arch})"
        )
    for key, (shape, _) in expected.items():
        found = tuple(np.shape(tensors[key]))
        if found != shape:
            raise UserError(
                f"{source}: key {key!r} has shape {list(found)}, the config's architecture needs {list(shape)}"
            )

    params_like, buffers_like = parameter_templates(cfg)
    flat = {}
    for name, leaf in _flatten(params_like).items():
        value = np.asarray(tensors[_torch_key(name)], dtype=np.float32)
        flat[name] = value.T.copy() if _is_linear_weight(name, tuple(leaf.shape)) else value
    params = _unflatten(flat, params_like)
    puzzle_emb = np.asarray(tensors["inner.puzzle_emb.weights"], dtype=np.float32)
    buffers = {name: np.asarray(tensors[f"inner.{name}"], dtype=np.float32) for name in buffers_like}
    return params, puzzle_emb, buffers


def params_to_state_dict(
    params: dict,
    puzzle_emb: Any,
    buffers: dict,
    *,
    forward_dtype: Any,
    prefix: str = DEFAULT_EXPORT_PREFIX,
) -> dict[str, np.ndarray]:
    """(params, puzzle_emb, buffers) -> the original's state_dict as NumPy arrays, keys with `prefix`.

    H_init/L_init are written in `forward_dtype` (the run's ModelConfig.dtype), as the original holds them.
    """
    state = {}
    for name, leaf in _flatten(jax.device_get(params)).items():
        value = np.asarray(leaf, dtype=np.float32)
        state[_torch_key(name)] = value.T.copy() if _is_linear_weight(name, value.shape) else value
    state["inner.puzzle_emb.weights"] = np.asarray(puzzle_emb, dtype=np.float32)
    for name, leaf in jax.device_get(buffers).items():
        state[f"inner.{name}"] = np.asarray(leaf).astype(np.dtype(forward_dtype))
    return {prefix + key: value for key, value in state.items()}


def _import_torch():
    try:
        import torch
    except ImportError:
        raise UserError(
            "reading or writing PyTorch checkpoints needs PyTorch: pip install 'trm-study[torch]' "
            "(or pip install torch==2.13.0)"
        ) from None
    return torch


def read_torch_file(path: str | Path) -> dict[str, np.ndarray]:
    """Load a torch.save'd state_dict as NumPy arrays (bfloat16 tensors become ml_dtypes.bfloat16)."""
    torch = _import_torch()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint file")
    with open(path, "rb") as stream:
        first = stream.read(1)
    # torch.save writes a zip archive; before PyTorch 1.6, a pickle (its first byte is the PROTO opcode).
    if not zipfile.is_zipfile(path) and first != b"\x80":
        raise UserError(
            f"{path}: not a PyTorch checkpoint (torch.save writes a zip archive; this file is not one)"
        )
    try:
        # weights_only: a state_dict holds only tensors, and this refuses to run pickled code.
        state_dict = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a corrupt or foreign file
        raise UserError(
            f"{path}: not a readable PyTorch checkpoint ({_load_failure(err)}); expected the original "
            "trainer's torch.save'd state_dict"
        ) from None
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise UserError(f"{path}: expected a state_dict (a mapping of names to tensors)")
    arrays = {}
    for key, tensor in state_dict.items():
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            arrays[key] = tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            arrays[key] = tensor.numpy()
    return arrays


def _load_failure(err: Exception) -> str:
    """torch.load's reason in one line: the weights_only refusal is a page of advice around one line that says
    what it met, and some errors are a bare number."""
    text = str(err)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return f"{type(err).__name__}: {line}" if len(line) < 20 else line


def write_torch_file(state_dict: dict[str, np.ndarray], path: str | Path) -> None:
    """torch.save a state_dict of NumPy arrays, bfloat16 kept as torch.bfloat16; written atomically."""
    torch = _import_torch()
    tensors = {}
    for key, value in state_dict.items():
        value = np.array(value, order="C")  # a writable copy: torch refuses to share read-only memory
        if value.dtype == ml_dtypes.bfloat16:
            tensors[key] = torch.from_numpy(value.view(np.int16)).view(torch.bfloat16)
        else:
            tensors[key] = torch.from_numpy(value)
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    torch.save(tensors, partial)
    partial.replace(path)
