"""Model configurations for tests: config/base.yaml's architecture with some fields changed, validated as a run
config is (the config holds every default and every rule; ModelConfig has neither)."""

from __future__ import annotations

from trm.config import load_config, validate_config
from trm.data.format import sudoku_metadata
from trm.model.config import DATASET_FIELDS, ModelConfig

SUDOKU = {field: sudoku_metadata(1)[field] for field in DATASET_FIELDS}


def model_config(**fields) -> ModelConfig:
    """The baseline architecture with `fields` changed (dataset sizes too: vocab_size, seq_len, ...)."""
    sizes = {field: fields.pop(field, SUDOKU[field]) for field in DATASET_FIELDS}
    config = load_config()
    config["arch"].update(fields)
    return ModelConfig.from_dict(validate_config(config, "the test's config")["arch"], sizes)
