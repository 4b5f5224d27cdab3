"""The raw dataset asset's I/O: a validated frame written to the run branch as Parquet."""

from __future__ import annotations

import io
import json

import pandas as pd

from resources.store.base import VersionedStore


def dataset_prefix(dataset: str) -> str:
    return f"datasets/{dataset}/"


def raw_path(dataset: str) -> str:
    return dataset_prefix(dataset) + "raw/data.parquet"


def write_raw(store: VersionedStore, branch: str, dataset: str, frame: pd.DataFrame, sources: list[dict]) -> None:
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    store.put_object(branch, raw_path(dataset), buf.getvalue())
    store.put_object(branch, dataset_prefix(dataset) + "raw/sources.json",
                     json.dumps(sources, indent=2, sort_keys=True).encode())


def read_raw(store: VersionedStore, ref: str, dataset: str) -> pd.DataFrame:
    return pd.read_parquet(io.BytesIO(store.get_object(ref, raw_path(dataset))))
