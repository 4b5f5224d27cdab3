"""Example text data: the English documentation topics that ship with Python (``pydoc_data``, the
text ``help("assert")`` prints; about 79 topics, 465,000 characters), as a language-modelling
corpus of one .txt file per topic, tokenized by a byte-level BPE trained on its training split,
and a small causal transformer language model trained on it, gated on perplexity."""

from __future__ import annotations

from pathlib import Path

from pipelines.api import TextCorpus, TextPreprocessing, dataset_pipeline, model_pipeline
from training_runtime.atomic_files import atomic_write_bytes

SOURCE_DIR = "pydoc"


def pydoc_topics() -> dict[str, str]:
    """Topic name -> its documentation text."""
    from pydoc_data.topics import topics

    return dict(topics)


def topic_file_name(topic: str) -> str:
    """Topics are identifiers already ("assert", "bltin-code-objects"); keep file names portable anyway."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in topic) + ".txt"


def write_pydoc_source(sources_root: Path) -> Path:
    """Write each topic as ``<sources_root>/pydoc/<topic>.txt`` (once: existing files are kept);
    return the folder. Each file is written atomically, so a crash leaves no half-written topic
    that would later pass for a whole one."""
    folder = sources_root / SOURCE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for topic, text in sorted(pydoc_topics().items()):
        path = folder / topic_file_name(topic)
        if not path.exists():
            atomic_write_bytes(path, text.encode("utf-8"))
    return folder


pydoc_corpus = dataset_pipeline(
    "pydoc",
    source=TextCorpus(paths=(f"{SOURCE_DIR}/*.txt",)),
    task="language_modeling",
    preprocessing=TextPreprocessing(tokenizer="bpe", vocab_size=2048, seq_len=128),
    description="Python's bundled documentation topics (pydoc_data), one document per topic, as 129-token "
                "windows of a 2,048-token byte-level BPE for language modelling.",
)

pydoc_lm = model_pipeline(
    "pydoc_lm",
    dataset="pydoc",
    task="language_modeling",
    model="transformer_lm",
    model_kwargs={"d_model": 96, "nhead": 4, "num_layers": 2, "dim_feedforward": 256},
    recipe={"epochs": 8, "batch_size": 32, "lr": 0.005, "world_size": 2, "checkpoint_every_steps": 50,
            "lr_schedule": "linear_warmup_cosine", "warmup_steps": 10},
    gate={"test_perplexity": {"max": 250}},
    description="A two-layer causal transformer language model of Python's documentation; its versions record "
                "test perplexity and a few sampled continuations of held-out text.",
)
