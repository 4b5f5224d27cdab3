"""A text corpus's shards in the versioned store: what a new version takes from the published one
(its manifest, whose parts it keeps, and its BPE tokenizer), and the log line of what it cost.

The tokenizer rule: a BPE tokenizer, once a corpus is in use, stays as it is, as GPT-2's does.
A new version keeps the published version's ``tokenizer.json`` while ``tokenizer``,
``vocab_size`` and ``function`` are those it was made with, unless ``refit_tokenizer`` asks to
train it again on the new training split (which changes every part's tokens: the version is
sharded whole, and its parts are new unless the refit gives the same file). Retraining it on every
version, as before parts, would make each version cost the whole corpus.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from assets.kinds.text_tokens import TOKENIZER_FILE
from assets.sharding import CARRIED
from core.spec import PipelineSpec, TextPreprocessing
from resources.store.base import MAIN, RefNotFoundError


@dataclass(frozen=True)
class PublishedShards:
    commit: str | None  # main's commit that a new version builds on; None before the first version
    manifest: dict | None  # the shards manifest published there
    tokenizer_file: Path | None  # its BPE tokenizer, downloaded, when the new version keeps it


def part_salt(key: dict | None) -> str:
    """What a part's key is salted with: the data key's parameters and code, as a table's parts are
    (assets/pipeline.py ``part_salt``, which this module cannot import: it imports the kinds)."""
    return f"{key.get('parameters', '')}:{key.get('code', '')}" if key else ""


def keeps_tokenizer(prep: TextPreprocessing, previous: dict | None) -> bool:
    """Whether a new version uses the published version's BPE tokenizer rather than training one."""
    if prep.tokenizer != "bpe" or prep.refit_tokenizer or not previous or previous.get("kind") != "text":
        return False
    made_with = previous.get("preprocessing", {})
    return (previous.get("tokenizer", {}).get("kind") == "bpe" and made_with.get("vocab_size") == prep.vocab_size
            and made_with.get("function") == prep.function)


def published_shards(store, spec: PipelineSpec, prefix: str, tmp: Path) -> PublishedShards:
    """What main holds of the corpus's shards, and its tokenizer when ``keeps_tokenizer``."""
    try:
        commit = store.resolve_ref(MAIN)
        manifest = json.loads(store.get_object(commit, prefix + "manifest.json"))
    except RefNotFoundError:
        return PublishedShards(None, None, None)
    tokenizer = None
    if keeps_tokenizer(spec.preprocessing or TextPreprocessing(), manifest):
        tokenizer = store.download(commit, prefix + manifest["tokenizer"].get("path", TOKENIZER_FILE),
                                   tmp / "published" / TOKENIZER_FILE)
    return PublishedShards(commit, manifest, tokenizer)


def sharded_line(dataset: str, manifest: dict, previous: dict | None, moved: dict) -> str:
    """What the shards of a new version cost, for the run's log (as a table's shards asset says it)."""
    published = {p["key"] for p in (previous or {}).get("parts", [])}
    made = [p for p in manifest["parts"] if p["key"] not in published]
    total = len(manifest["parts"])
    kept = f", the other {total - len(made)} kept from the published version" if previous else ""
    shards = [e for info in manifest["splits"].values() for e in info["shards"]]
    carried = sum(bool(e.get(CARRIED)) for e in shards)
    return (f"{dataset}: {len(made)} of {total} part(s) sharded{kept}; {moved['kept']} shard file(s) kept, "
            f"{moved['removed']} removed; the shard checks read {len(shards) - carried} shard file(s) and judged "
            f"{carried} kept one(s) by their parts' records")
