"""The dataset a run trains on: its staged copy fetched, checked against the config's data settings and bound to
the run dir (data.json, trm/run/layout.py), so that a run's config says what it trained on, and a run never resumes
on another dataset than the one its checkpoints were trained on."""

from __future__ import annotations

from trm.data.format import SplitData, check_data_settings, check_same_format, load_split
from trm.data.manifest import read_manifest
from trm.data.verify import fetch_dataset
from trm.run import distributed, layout


def check_resumed_data(run_dir: str, data_url: str) -> None:
    """Before anything is written to `run_dir`: refuse `data_url` if the run dir is bound to another dataset."""
    if layout.bound_data(run_dir) is not None:
        layout.bind_data(run_dir, data_url, read_manifest(data_url).hash, write=False)


def load_run_data(
    config: dict, data_url: str, run_dir: str, cache_dir: str, writer: bool
) -> tuple[SplitData, SplitData]:
    """The train and test splits of the dataset staged at `data_url`, in this host's copy under `cache_dir`.

    UserError when the config's data settings do not describe it, or the run dir is bound to another dataset;
    otherwise the run dir is bound to it (by the writer, once)."""
    manifest = read_manifest(data_url)
    distributed.check_hosts_agree(f"the manifest of {data_url}", manifest.hash)
    layout.bind_data(run_dir, data_url, manifest.hash, write=False)
    dataset_dir = fetch_dataset(data_url, cache_dir, manifest)  # every host reads its own local copy
    train, test = load_split(dataset_dir, "train"), load_split(dataset_dir, "test")
    check_same_format(train.metadata, test.metadata)
    check_data_settings(config["data"], train, data_url)
    layout.bind_data(run_dir, data_url, manifest.hash, write=writer)
    return train, test
