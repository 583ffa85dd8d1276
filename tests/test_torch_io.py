"""Original PyTorch TRM checkpoints: the documented layout, refusals, and export -> import round trips."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from trm.cli import main as trm
from trm.config import BASE_CONFIG, load_config
from trm.data.format import sudoku_metadata
from trm.errors import UserError
from trm.model.act import initial_carry
from trm.model.config import ModelConfig
from trm.model.torch_io import params_to_state_dict, state_dict_to_params
from trm.train.step import ModelTemplate
from trm.train.weights import load_weights, write_run_dir

TINY = {
    "arch.hidden_size": 32,
    "arch.num_heads": 2,
    "arch.L_layers": 2,
    "arch.H_cycles": 2,
    "arch.L_cycles": 2,
    "arch.forward_dtype": "float32",
    "train.global_batch_size": 4,
}


def _config(**extra) -> dict:
    return load_config(BASE_CONFIG, [f"{k}={v}" for k, v in {**TINY, **extra}.items()])


def _model_cfg(config: dict) -> ModelConfig:
    return ModelConfig.from_dict(config["arch"], sudoku_metadata(1))


def _hand_built(rng: np.random.Generator, hidden: int = 32, layers: int = 2) -> dict[str, np.ndarray]:
    """An MLP-T Sudoku state_dict written from spec Appendix A, as the original trainer saves it."""
    inter, inter_t, vocab, length = 256, 512, 11, 97  # SwiGLU widths for D = 32 and S = 97
    shapes = {
        "inner.embed_tokens.embedding_weight": (vocab, hidden),
        "inner.lm_head.weight": (vocab, hidden),
        "inner.q_head.weight": (2, hidden),
        "inner.q_head.bias": (2,),
        "inner.puzzle_emb.weights": (1, hidden),
    }
    for i in range(layers):
        shapes[f"inner.L_level.layers.{i}.mlp_t.gate_up_proj.weight"] = (2 * inter_t, length)
        shapes[f"inner.L_level.layers.{i}.mlp_t.down_proj.weight"] = (length, inter_t)
        shapes[f"inner.L_level.layers.{i}.mlp.gate_up_proj.weight"] = (2 * inter, hidden)
        shapes[f"inner.L_level.layers.{i}.mlp.down_proj.weight"] = (hidden, inter)
    state = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    for name in ("H_init", "L_init"):
        state[f"inner.{name}"] = rng.standard_normal(hidden).astype(ml_dtypes.bfloat16)
    return {f"_orig_mod.model.{k}": v for k, v in state.items()}


def test_hand_built_state_dict_maps_to_our_layout():
    sd = _hand_built(np.random.default_rng(0))
    params, puzzle_emb, buffers = state_dict_to_params(sd, _model_cfg(_config()), source="hand-built")
    p = "_orig_mod.model.inner."
    np.testing.assert_array_equal(params["embed_tokens"], sd[p + "embed_tokens.embedding_weight"])
    np.testing.assert_array_equal(params["lm_head"]["weight"], sd[p + "lm_head.weight"].T)
    np.testing.assert_array_equal(params["q_head"]["weight"], sd[p + "q_head.weight"].T)
    np.testing.assert_array_equal(params["q_head"]["bias"], sd[p + "q_head.bias"])
    layer = params["layers"][1]
    np.testing.assert_array_equal(
        layer["mlp_t"]["gate_up_proj"]["weight"], sd[p + "L_level.layers.1.mlp_t.gate_up_proj.weight"].T
    )
    np.testing.assert_array_equal(
        layer["mlp"]["down_proj"]["weight"], sd[p + "L_level.layers.1.mlp.down_proj.weight"].T
    )
    np.testing.assert_array_equal(puzzle_emb, sd[p + "puzzle_emb.weights"])
    assert buffers["H_init"].dtype == np.float32  # holds the file's bfloat16 values exactly
    np.testing.assert_array_equal(buffers["L_init"], sd[p + "L_init"].astype(np.float32))
    # The gate is the first half of the fused projection in both: our columns 0..511 = their rows 0..511.
    np.testing.assert_array_equal(
        layer["mlp_t"]["gate_up_proj"]["weight"][:, :512].T,
        sd[p + "L_level.layers.1.mlp_t.gate_up_proj.weight"][:512],
    )
    # Unprefixed keys and the non-persistent buffers of some versions are accepted too.
    plain = {k.removeprefix("_orig_mod.model."): v for k, v in sd.items()}
    plain["inner.puzzle_emb.local_ids"] = np.zeros(4, np.int32)
    again = state_dict_to_params(plain, _model_cfg(_config()), source="plain")
    np.testing.assert_array_equal(again[0]["lm_head"]["weight"], params["lm_head"]["weight"])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda sd: sd.update({"_orig_mod.model.inner.lm_head.weight": np.zeros((11, 64), np.float32)}),
         "key 'inner.lm_head.weight' has shape [11, 64], the config's architecture needs [11, 32]"),
        (lambda sd: sd.pop("_orig_mod.model.inner.L_level.layers.1.mlp.down_proj.weight"),
         "missing key 'inner.L_level.layers.1.mlp.down_proj.weight'"),
        (lambda sd: sd.update({"_orig_mod.model.inner.L_level.layers.2.mlp.down_proj.weight": np.zeros((32, 256))}),
         "unexpected key 'inner.L_level.layers.2.mlp.down_proj.weight'"),
        (lambda sd: sd.update({"_orig_mod.model.inner.H_level.layers.0.mlp.down_proj.weight": np.zeros((32, 256))}),
         "unknown architecture: keys 'inner.H_level.*' belong to HRM"),
    ],
)  # fmt: skip
def test_refuses_state_dicts_that_do_not_fit(change, message):
    sd = _hand_built(np.random.default_rng(1))
    change(sd)
    with pytest.raises(UserError) as err:
        state_dict_to_params(sd, _model_cfg(_config()), source="bad.pt")
    assert str(err.value).startswith("bad.pt: ") and message in str(err.value)


@pytest.mark.slow
def test_attention_file_with_an_mlp_t_config_is_refused_naming_the_key():
    attention = _config(**{"arch.mlp_t": "false", "arch.pos_encodings": "rope"})
    model = ModelTemplate(_model_cfg(attention), seed=0)
    sd = params_to_state_dict(
        model.init_params, model.init_puzzle_emb, model.init_buffers, forward_dtype=model.cfg.dtype
    )
    with pytest.raises(UserError, match="missing key 'inner.L_level.layers.0.mlp_t.down_proj.weight'"):
        state_dict_to_params(sd, _model_cfg(_config()), source="attn.pt")


def _logits(model: ModelTemplate, params, puzzle_emb, buffers) -> np.ndarray:
    module = model.bind(params, puzzle_emb, buffers)
    inputs = jnp.asarray(np.random.default_rng(2).integers(1, 11, (2, 81)), jnp.int32)
    carry = initial_carry(module, 2)
    z_H, z_L = (jnp.broadcast_to(v[...].astype(module.cfg.dtype), carry.z_H.shape) for v in (module.H_init, module.L_init))  # fmt: skip
    _, _, logits, q = module(z_H, z_L, inputs, jnp.zeros(2, jnp.int32))
    return np.asarray(jnp.concatenate([logits.reshape(2, -1), q], axis=1))


@pytest.mark.slow
@pytest.mark.parametrize("arch", [{}, {"arch.mlp_t": "false", "arch.pos_encodings": "rope"}])
def test_round_trip_in_memory_gives_identical_params_and_logits(arch):
    config = _config(**arch)
    model = ModelTemplate(_model_cfg(config), seed=3)
    # A trained-looking puzzle embedding, so that it is not all zeros.
    puzzle_emb = np.random.default_rng(4).standard_normal(model.init_puzzle_emb.shape).astype(np.float32)
    sd = params_to_state_dict(
        model.init_params, puzzle_emb, model.init_buffers, forward_dtype=model.cfg.dtype
    )
    params, emb, buffers = state_dict_to_params(sd, model.cfg, source="memory")
    for a, b in zip(jax.tree.leaves((params, emb, buffers)), jax.tree.leaves((model.init_params, puzzle_emb, model.init_buffers)), strict=True):  # fmt: skip
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        _logits(model, params, emb, buffers),
        _logits(model, model.init_params, puzzle_emb, model.init_buffers),
    )


@pytest.mark.slow
def test_export_then_import_through_the_cli(tmp_path):
    import torch  # the dev extra installs it; a skip would fail the session anyway (tests/conftest.py)

    config = _config()
    model = ModelTemplate(_model_cfg(config), seed=5)
    params = jax.tree.map(lambda x: x + 0.01, model.init_params)  # differ from any fresh init
    write_run_dir(
        str(tmp_path / "ours"), config, model.cfg, params, model.init_puzzle_emb, model.init_buffers, {}
    )

    assert (
        trm(["export-torch", "--checkpoint", str(tmp_path / "ours"), "--out", str(tmp_path / "model.pt")])
        == 0
    )
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    assert saved["_orig_mod.model.inner.H_init"].dtype == torch.float32  # the run's forward dtype
    assert saved["_orig_mod.model.inner.q_head.weight"].shape == (2, 32)  # [out, in]
    assert saved["_orig_mod.model.inner.L_level.layers.0.mlp_t.down_proj.weight"].shape == (97, 512)

    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    args = ["import-torch", str(tmp_path / "model.pt"), "--config", str(config_file)]
    assert trm([*args, "--out", str(tmp_path / "imported")]) == 0
    ours, imported = load_weights(str(tmp_path / "ours")), load_weights(str(tmp_path / "imported"))
    assert imported.source == "ema" and imported.model_cfg == ours.model_cfg
    for a, b in zip(jax.tree.leaves(ours.params), jax.tree.leaves(imported.params), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        _logits(model, ours.params, ours.puzzle_emb, ours.buffers),
        _logits(model, imported.params, imported.puzzle_emb, imported.buffers),
    )
    provenance = json.loads((tmp_path / "imported" / "provenance.json").read_text())
    assert provenance["source"] == str(tmp_path / "model.pt") and len(provenance["sha256"]) == 64


def _float32_start_states(rng: np.random.Generator, hidden: int) -> dict[str, np.ndarray]:
    """H_init/L_init as an original float32 run holds them: values that bfloat16 cannot represent."""
    start = {name: rng.standard_normal(hidden).astype(np.float32) for name in ("H_init", "L_init")}
    for values in start.values():
        assert not np.array_equal(values, values.astype(ml_dtypes.bfloat16).astype(np.float32))
    return start


@pytest.mark.slow
def test_float32_start_states_of_an_original_float32_run_keep_their_values(tmp_path):
    """The original keeps H_init/L_init in its forward dtype; import must not round a float32 run's to bfloat16."""
    import torch  # the dev extra installs it; a skip would fail the session anyway (tests/conftest.py)

    config = _config()  # forward_dtype float32
    model = ModelTemplate(_model_cfg(config), seed=9)
    start = _float32_start_states(np.random.default_rng(9), model.cfg.hidden_size)
    sd = params_to_state_dict(model.init_params, model.init_puzzle_emb, start, forward_dtype=np.float32)
    torch.save({k: torch.from_numpy(np.array(v)) for k, v in sd.items()}, tmp_path / "orig.pt")
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = tmp_path / "imported"
    assert trm(["import-torch", str(tmp_path / "orig.pt"), "--config", str(tmp_path / "config.json"), "--out", str(out)]) == 0  # fmt: skip

    imported = load_weights(str(out))
    for name, values in start.items():
        assert imported.buffers[name].dtype == np.float32
        np.testing.assert_array_equal(imported.buffers[name], values)
    # The first supervision step starts from them: the logits are those of the file's values, which
    # rounding the start states to bfloat16 would change.
    want = _logits(model, model.init_params, model.init_puzzle_emb, start)
    np.testing.assert_array_equal(
        _logits(model, imported.params, imported.puzzle_emb, imported.buffers), want
    )
    rounded = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in start.items()}
    assert not np.array_equal(_logits(model, model.init_params, model.init_puzzle_emb, rounded), want)
    # Exported again, they are written in the run's forward dtype with the same values.
    assert trm(["export-torch", "--checkpoint", str(out), "--out", str(tmp_path / "again.pt")]) == 0
    again = torch.load(tmp_path / "again.pt", weights_only=True)
    for name, values in start.items():
        np.testing.assert_array_equal(again[f"_orig_mod.model.inner.{name}"].numpy(), values)


def test_import_refusals_exit_2_and_write_nothing(tmp_path, capsys):
    import torch  # the dev extra installs it; a skip would fail the session anyway (tests/conftest.py)

    sd = _hand_built(np.random.default_rng(6))
    sd["_orig_mod.model.inner.lm_head.weight"] = np.zeros((11, 48), np.float32)
    tensors = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in sd.items()}
    torch.save(tensors, tmp_path / "wrong.pt")
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(_config()))

    def fails(path: Path) -> str:
        assert (
            trm(["import-torch", str(path), "--config", str(config_file), "--out", str(tmp_path / "out")])
            == 2
        )
        return capsys.readouterr().err

    assert "'inner.lm_head.weight' has shape [11, 48]" in fails(tmp_path / "wrong.pt")
    assert "no such checkpoint file" in fails(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert "junk.pt: not a PyTorch checkpoint (torch.save writes a zip archive" in fails(tmp_path / "junk.pt")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_trm_train_fine_tunes_an_imported_run_dir(tmp_path):
    """`trm train` resumes from the imported step-0 checkpoint: training starts from the imported weights."""
    import torch  # the dev extra installs it; a skip would fail the session anyway (tests/conftest.py)

    solution = "".join(str((3 * (r % 3) + r // 3 + c) % 9 + 1) for r in range(9) for c in range(9))
    rows = [solution[:i] + "." + solution[i + 1 :] for i in range(0, 80, 4)]
    (tmp_path / "p.csv").write_text("question,answer\n" + "".join(f"{q},{solution}\n" for q in rows))
    assert trm(["build-dataset", "--source", str(tmp_path / "p.csv"), "--num-aug", "1", "--output-dir", str(tmp_path / "d")]) == 0  # fmt: skip
    assert trm(["stage", str(tmp_path / "d"), f"file://{tmp_path / 'staged'}"]) == 0

    config = (
        _config(  # the data settings of the dataset above: 16 of its 20 puzzles train, 1 augmentation each
            **{"data.train_puzzles": 16, "data.num_aug": 1, "arch.L_layers": 1, "train.epochs": 1}
            | {"train.eval_interval": 1, "train.eval_subset": 4}
        )
    )
    model = ModelTemplate(_model_cfg(config), seed=8)
    start = _float32_start_states(np.random.default_rng(8), model.cfg.hidden_size)
    sd = params_to_state_dict(model.init_params, model.init_puzzle_emb, start, forward_dtype=np.float32)
    torch.save({k: torch.from_numpy(np.array(v, np.float32)) for k, v in sd.items()}, tmp_path / "orig.pt")
    (tmp_path / "config.json").write_text(json.dumps(config))
    run = tmp_path / "run"
    assert trm(["import-torch", str(tmp_path / "orig.pt"), "--config", str(tmp_path / "config.json"), "--out", str(run)]) == 0  # fmt: skip

    args = ["train", "--config", str(run / "config.json"), "--data", f"file://{tmp_path / 'staged'}"]
    assert trm([*args, "--run-dir", str(run), "--cache-dir", str(tmp_path / "cache")]) == 0
    final = json.loads((run / "final.json").read_text())
    assert final["steps"] >= 1
    trained = load_weights(str(run))
    assert trained.step == final["steps"]
    # Warm-up makes the first updates tiny: the fine-tuned weights stay next to the imported ones.
    imported, tuned = model.init_params["lm_head"]["weight"], trained.params["lm_head"]["weight"]
    assert not np.array_equal(imported, tuned)
    np.testing.assert_allclose(tuned, imported, atol=1e-3)
    # The frozen start states come through the import, the resume and the final checkpoint unchanged.
    for name, values in start.items():
        np.testing.assert_array_equal(trained.buffers[name], values)
