"""The model weights of a run dir, for evaluation and export; and run dirs made from imported weights.

A run dir written by `trm train` holds config.json (the resolved config) and ckpt/ (orbax checkpoints of the
whole training state). `load_weights` reads only the model from the latest checkpoint: the EMA shadow of the
parameters when the run kept one (as the original evaluates and saves), else the raw parameters, plus the
puzzle embedding and H_init/L_init.

`write_run_dir` builds a run dir from given weights (e.g. an imported PyTorch checkpoint): config.json and a
step-0 checkpoint of a fresh training state that holds them (EMA = the weights, fresh optimizer state, empty
ACT carry). `trm evaluate` reads it like any run dir, and `trm train --config RUN/config.json --run-dir RUN`
resumes from it, i.e. fine-tunes the imported weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from trm import storage
from trm.config import config_hash
from trm.errors import UserError
from trm.model.config import ModelConfig
from trm.model.torch_io import parameter_templates
from trm.run import layout
from trm.train.checkpoint import Checkpointer, orbax_path, read_checkpoint
from trm.train.step import ModelTemplate, init_state


@dataclass
class RunWeights:
    """The model of one checkpoint: its config, architecture and arrays (pure dicts, like TrainState's)."""

    config: dict  # the run's resolved config (config.json)
    model_cfg: ModelConfig
    params: dict  # dense parameters: the EMA shadow when `source` is "ema"
    puzzle_emb: np.ndarray
    buffers: dict  # H_init, L_init
    step: int  # optimizer steps done at the checkpoint
    source: str  # "ema" or "params"


def _leaf_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """Flattened "a.b.0.c" -> shape, with dict keys as strings (as orbax stores them)."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join(str(getattr(k, "key", k)) for k in path): tuple(leaf.shape) for path, leaf in flat}


def _like(template: Any, restored: Any) -> Any:
    """`restored` (string keys) with the key types of `template` (int layer indices), as float arrays."""
    if isinstance(template, dict):
        return {key: _like(value, restored[str(key)]) for key, value in template.items()}
    return np.asarray(restored)


def read_run_config(run_dir: str) -> dict:
    """The resolved config.json of a run dir, validated; UserError if the dir or the file is missing."""
    if not storage.exists(run_dir):
        raise UserError(f"{run_dir}: no such checkpoint (run directory)")
    if not storage.exists(layout.path(run_dir, layout.CONFIG)):
        raise UserError(f"{run_dir}: not a run directory (no {layout.CONFIG})")
    return layout.read_config(layout.path(run_dir, layout.CONFIG))


def load_weights(run_dir: str, seq_len: int | None = None) -> RunWeights:
    """The model of the latest checkpoint in `run_dir` (EMA weights when the run kept an EMA).

    vocab_size and num_puzzle_identifiers come from the checkpoint's arrays, and so does seq_len when the
    architecture fixes it (MLP-T, learned positions); otherwise `seq_len` (the evaluation data's) is used.
    Raises UserError when the run dir, its config or its checkpoint is missing, or the checkpoint's arrays
    do not fit the architecture in config.json.
    """
    config = read_run_config(run_dir)
    ckpt_url = layout.path(run_dir, layout.CHECKPOINTS)
    if not storage.exists(ckpt_url):
        raise UserError(f"{run_dir}: no checkpoint (no ckpt/ directory)")
    manager = ocp.CheckpointManager(
        orbax_path(ckpt_url),
        item_handlers={"state": ocp.PyTreeCheckpointHandler()},
        options=ocp.CheckpointManagerOptions(read_only=True),
    )
    step = manager.latest_step()
    if step is None:
        raise UserError(f"{ckpt_url}: no checkpoint")
    metadata = read_checkpoint(f"{ckpt_url}/{step}", lambda: manager.item_metadata(step)["state"])
    saved = getattr(metadata, "tree", metadata)
    if not isinstance(saved, dict) or not {"params", "puzzle_emb", "buffers"} <= set(saved):
        raise UserError(f"{ckpt_url}/{step}: not a checkpoint of a TRM training state")

    model_cfg = _model_config(config["arch"], saved, seq_len, f"{ckpt_url}/{step}")
    params_like, buffers_like = parameter_templates(model_cfg)
    has_ema = bool(saved.get("ema"))
    expected = {"params": params_like, "buffers": buffers_like}
    if has_ema:
        expected["ema"] = params_like
    for part, template in expected.items():
        want, found = _leaf_shapes(template), _leaf_shapes(saved[part])
        for name in sorted(set(want) | set(found)):
            if want.get(name) != found.get(name):
                raise UserError(
                    f"{ckpt_url}/{step}: {part}.{name} has shape {found.get(name)}, the architecture in "
                    f"{run_dir}/config.json needs {want.get(name)} (checkpoint of another architecture?)"
                )

    wanted = ["ema" if has_ema else "params", "puzzle_emb", "buffers"]
    item = {k: jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved[k]) for k in wanted}
    # Restore as host NumPy arrays: works whatever devices or topology wrote the checkpoint.
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    restore = ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
    restored = read_checkpoint(
        f"{ckpt_url}/{step}", lambda: manager.restore(step, args=ocp.args.Composite(state=restore)).state
    )
    manager.close()
    return RunWeights(
        config=config,
        model_cfg=model_cfg,
        params=_like(params_like, restored[wanted[0]]),
        puzzle_emb=np.asarray(restored["puzzle_emb"]),
        buffers=_like(buffers_like, restored["buffers"]),
        step=int(step),
        source=wanted[0],
    )


def _model_config(arch: dict, saved: dict, seq_len: int | None, where: str) -> ModelConfig:
    """The architecture with the dataset sizes read off the checkpoint's arrays."""
    sizes = {
        "vocab_size": saved["params"]["embed_tokens"].shape[0],
        "num_puzzle_identifiers": saved["puzzle_emb"].shape[0],
        "seq_len": 1,  # placeholder, to learn the prefix length
    }
    prefix_len = ModelConfig.from_dict(arch, sizes).prefix_len
    if arch["mlp_t"]:
        # The token-mixing SwiGLU's input width is prefix + seq_len.
        sizes["seq_len"] = (
            saved["params"]["layers"]["0"]["mlp_t"]["gate_up_proj"]["weight"].shape[0] - prefix_len
        )
    elif arch["pos_encodings"] == "learned":
        sizes["seq_len"] = saved["params"]["embed_pos"].shape[0] - prefix_len
    elif seq_len is not None:
        sizes["seq_len"] = seq_len
    else:
        raise UserError(f"{where}: the architecture does not fix seq_len; give the data's")
    return ModelConfig.from_dict(arch, sizes)


def write_run_dir(
    run_dir: str,
    config: dict,
    model_cfg: ModelConfig,
    params: dict,
    puzzle_emb: np.ndarray,
    buffers: dict,
    provenance: dict,
) -> None:
    """Create run dir `run_dir` holding the given weights as its step-0 checkpoint (see module docstring).

    Refuses an existing config.json or checkpoint. The checkpoint is committed before config.json and
    provenance.json are written, so a run dir with a config.json is complete.
    """
    if any(storage.exists(layout.path(run_dir, name)) for name in (layout.CONFIG, layout.CHECKPOINTS)):
        raise UserError(
            f"{run_dir}: already holds a run ({layout.CONFIG} or {layout.CHECKPOINTS}/); choose a new --out"
        )
    model = ModelTemplate(model_cfg, seed=config["train"]["seed"])
    state = init_state(model, config, batch_rows=config["train"]["global_batch_size"])
    dense = jax.tree.map(jnp.asarray, params)
    state = state._replace(
        params=dense,
        puzzle_emb=jnp.asarray(puzzle_emb, jnp.float32),
        buffers=jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), buffers),
        ema=jax.tree.map(lambda x: jnp.array(x, copy=True), dense) if state.ema is not None else None,
    )
    checkpoints = Checkpointer(layout.path(run_dir, layout.CHECKPOINTS), keep=1, every_steps=1)
    checkpoints.save(0, state, {"imported": provenance})
    checkpoints.wait()
    checkpoints.close()
    layout.claim(run_dir, config, config_hash(config))
    storage.write_text(layout.path(run_dir, layout.PROVENANCE), json.dumps(provenance, indent=2) + "\n")
