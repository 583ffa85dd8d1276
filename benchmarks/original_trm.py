"""Run the ORIGINAL PyTorch TRM's own code from a checkout given by path (never part of this project).

The original (github.com/SamsungSAILMontreal/TinyRecursiveModels) trains through `pretrain.py`: its
`create_model` (the model, its ACT loss head, torch.compile unless DISABLE_COMPILE is set, the
puzzle-embedding sign-SGD and AdamATan2), its `train_batch` and `EMAHelper`. The benchmarks call those
functions themselves. Only what `pretrain.py` imports for logging and configuration is replaced, when it is
not installed:

- `wandb` is ALWAYS replaced by `Recorder`, which appends every `wandb.log` call to a JSON-lines file (or
  drops it) and never touches the network;
- `hydra` (its `main` decorator returns the function unchanged: the benchmark composes the config itself, see
  `sudoku_config`), `omegaconf.DictConfig`, `coolname` and `argdantic` (imported by `puzzle_dataset.py` for
  its command line only) get inert stand-ins;
- `adam_atan2` (a CUDA extension, github.com/imoneoi/adam_atan2): if it is not importable, `AdamATan2Torch`,
  a plain-PyTorch transcription of its kernel's arithmetic, takes its place (`OPTIMIZER` says which ran).

`pydantic`, `torch`, `numpy`, `einops`, `tqdm` and `yaml` must be installed.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import time
import types
from pathlib import Path
from typing import Any

OPTIMIZER = {"name": "adam_atan2 (CUDA extension)"}


class Recorder(types.ModuleType):
    """Stand-in for `wandb`: `log(metrics, step)` appends {step, wall_s, **metrics} to `path` (if any)."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.path: Path | None = None
        self.run = None  # pretrain.save_code_and_config returns early when wandb.run is None
        self.start = time.monotonic()

    def init(self, **_: Any) -> None:
        self.start = time.monotonic()

    def Settings(self, **_: Any) -> None:  # noqa: N802 (wandb's name)
        return None

    def log(self, metrics: dict, step: int | None = None) -> None:
        if self.path is None:
            return
        record = {"step": step, "wall_s": time.monotonic() - self.start}
        record |= {k: _plain(v) for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def finish(self) -> None:
        return None


def _plain(value: Any) -> Any:
    """A JSON-ready copy of a logged value (NumPy scalars and nested dicts of them)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def _inert(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


def _stand_ins() -> dict[str, types.ModuleType]:
    return {
        "hydra": _inert("hydra", main=lambda **_: lambda fn: fn),
        "omegaconf": _inert("omegaconf", DictConfig=dict),
        "coolname": _inert("coolname", generate_slug=lambda n=2: "benchmark"),
        "argdantic": _inert("argdantic", ArgParser=type("ArgParser", (), {})),
    }


def AdamATan2Torch(*args: Any, **kwargs: Any):  # noqa: N802 (stands in for a class)
    """adam_atan2's AdamATan2 in plain PyTorch: same arguments, same per-element arithmetic in float32."""
    import torch

    class _AdamATan2(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-2) -> None:
            super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

        @torch.no_grad()
        def step(self) -> None:
            for group in self.param_groups:
                beta1, beta2 = group["betas"]
                lr, weight_decay = group["lr"], group["weight_decay"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:
                        state["step"] = 0
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                    state["step"] += 1
                    # The kernel computes these in double from the step count, then casts to float32.
                    bias1 = 1 - beta1 ** state["step"]
                    bias2_sqrt = math.sqrt(1 - beta2 ** state["step"])
                    m, v = state["exp_avg"], state["exp_avg_sq"]
                    p.mul_(1 - lr * weight_decay)
                    m.lerp_(p.grad, 1 - beta1)
                    v.lerp_(p.grad.square(), 1 - beta2)
                    p.sub_(torch.atan2(m, v.sqrt() / bias2_sqrt), alpha=lr / bias1)

    return _AdamATan2(*args, **kwargs)


def import_original(repo: Path, log_path: Path | None = None) -> types.ModuleType:
    """The original's `pretrain` module, imported from `repo` with the stand-ins above where needed."""
    if not (repo / "pretrain.py").is_file() or not (repo / "models" / "recursive_reasoning").is_dir():
        raise SystemExit(
            f"--original-repo {repo}: not a TinyRecursiveModels checkout (no pretrain.py, models/)"
        )
    recorder = Recorder()
    recorder.path = log_path
    sys.modules["wandb"] = recorder
    for name, module in _stand_ins().items():
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules[name] = module
    try:
        importlib.import_module("adam_atan2")
    except ImportError:
        sys.modules["adam_atan2"] = _inert("adam_atan2", AdamATan2=AdamATan2Torch)
        OPTIMIZER["name"] = "AdamATan2Torch (plain-PyTorch transcription of adam_atan2's kernel)"
    sys.path.insert(0, str(repo))
    return importlib.import_module("pretrain")


def sudoku_config(
    repo: Path, batch: int, data_path: str, epochs: int, eval_interval: int, checkpoint_path: str
) -> dict:
    """The config `pretrain.py` composes for the README's Sudoku-Extreme MLP-T command, as a plain dict.

    The checkout's cfg_pretrain.yaml <- arch/trm.yaml (in its config folder) <- the README command's overrides
    (lr 1e-4, puzzle_emb_lr 1e-4, weight_decay 1.0, puzzle_emb_weight_decay 1.0, mlp_t, no position encodings,
    L_layers 2, H_cycles 3, L_cycles 6, ema) and this benchmark's batch, data path, epochs and evaluation
    interval.
    """
    import yaml

    base = yaml.safe_load((repo / "config" / "cfg_pretrain.yaml").read_text())
    arch = yaml.safe_load((repo / "config" / "arch" / "trm.yaml").read_text())
    base.pop("defaults", None)
    base.pop("hydra", None)
    arch.update(mlp_t=True, pos_encodings="none", L_layers=2, H_cycles=3, L_cycles=6)
    arch["puzzle_emb_ndim"] = arch["hidden_size"]  # the yaml's interpolation ${.hidden_size}
    base.update(
        arch=arch,
        data_paths=[data_path],
        evaluators=[],
        global_batch_size=batch,
        epochs=epochs,
        eval_interval=eval_interval,
        lr=1e-4,
        puzzle_emb_lr=1e-4,
        weight_decay=1.0,
        puzzle_emb_weight_decay=1.0,
        ema=True,
        checkpoint_path=checkpoint_path,
        run_name="benchmark",
        project_name="benchmark",
    )
    return base


class OriginalTrainStep:
    """The original's own train step on the CPU, eager (how the original runs without a GPU).

    Its model, ACT loss head, optimizers (`CastedSparseEmbeddingSignSGD_Distributed`, `AdamATan2`) and
    `EMAHelper` are built as `pretrain.create_model` builds them, and `step()` runs the body of
    `pretrain.train_batch` (forward, backward of loss / batch, each optimizer at its scheduled lr, metrics to
    the host) and the EMA update. Both are transcribed here because the original's own functions put
    everything on CUDA; nothing else differs. On a GPU, bench_gpu_step.py calls the original's functions
    themselves.
    """

    def __init__(self, repo: Path, width: int, dtype: str, batch: int, threads: int) -> None:
        import torch

        pretrain = import_original(repo)
        from models.ema import EMAHelper
        from models.sparse_embedding import CastedSparseEmbeddingSignSGD_Distributed
        from utils.functions import load_model_class

        self.torch, self.pretrain, self.batch_size = torch, pretrain, batch
        torch.set_num_threads(threads)
        torch.random.manual_seed(0)
        raw = sudoku_config(repo, batch, "unused", epochs=100_000, eval_interval=100_000, checkpoint_path="")
        raw["arch"].update(hidden_size=width, puzzle_emb_ndim=width, forward_dtype=dtype)
        self.config = config = pretrain.PretrainConfig(**raw)
        model_cfg = dict(
            **config.arch.__pydantic_extra__,
            batch_size=batch,
            vocab_size=11,
            seq_len=81,
            num_puzzle_identifiers=1,
            causal=False,
        )
        model = load_model_class(config.arch.name)(model_cfg)
        model = load_model_class(config.arch.loss.name)(model, **config.arch.loss.__pydantic_extra__)
        optimizers = [
            CastedSparseEmbeddingSignSGD_Distributed(
                model.model.puzzle_emb.buffers(),
                lr=0,
                weight_decay=config.puzzle_emb_weight_decay,
                world_size=1,
            ),
            sys.modules["adam_atan2"].AdamATan2(
                model.parameters(), lr=0, weight_decay=config.weight_decay, betas=(config.beta1, config.beta2)
            ),
        ]
        self.state = pretrain.TrainState(
            model=model,
            optimizers=optimizers,
            optimizer_lrs=[config.puzzle_emb_lr, config.lr],
            carry=None,
            step=0,
            total_steps=10**9,
        )
        self.ema = EMAHelper(mu=config.ema_rate)
        self.ema.register(model)
        gen = torch.Generator().manual_seed(0)
        self.batch = {
            "inputs": torch.randint(1, 11, (batch, 81), generator=gen, dtype=torch.int32),
            "labels": torch.randint(2, 11, (batch, 81), generator=gen, dtype=torch.int32),
            "puzzle_identifiers": torch.zeros(batch, dtype=torch.int32),
        }

    def step(self) -> None:
        """pretrain.train_batch without its .cuda() (world size 1), then the training loop's EMA update."""
        state, config = self.state, self.config
        state.step += 1
        if state.carry is None:
            state.carry = state.model.initial_carry(self.batch)
        state.carry, loss, metrics, _, _ = state.model(carry=state.carry, batch=self.batch, return_keys=[])
        ((1 / self.batch_size) * loss).backward()
        for optim, base_lr in zip(state.optimizers, state.optimizer_lrs, strict=True):
            lr = self.pretrain.compute_lr(base_lr, config, state)
            for group in optim.param_groups:
                group["lr"] = lr
            optim.step()
            optim.zero_grad()
        self.torch.stack([metrics[k] for k in sorted(metrics)]).cpu().numpy()
        self.ema.update(state.model)
