"""The declarative description of one model pipeline: what data, which model, how to train,
what counts as good enough, and when to retrain. Validated when definitions load."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping, Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is only named in annotations; image pool workers import this module
    import pandas as pd

from core.expectations import standard_raw_expectations, standard_shard_expectations
from core.spec_fields import PipelineDefinitionError, fail
from core.placement import Placement, placement_problems
# The guards' settings are the runtime's own (one set of fields, defaults, descriptions and rules);
# training_runtime.config is torch-free.
from training_runtime.config import GuardsConfig as Guards
from training_runtime.config import fsdp_problems, guard_problems

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_LOCATION = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")  # Dagster code location names


_fail = fail  # every field check raises PipelineDefinitionError("pipeline 'x', field 'y': ...")


# The column of the raw Parquet copy that holds all features (assets/ingest.py)
RAW_FEATURES_COLUMN = "features"
# ... and the one holding a multi-label table's 0/1 label columns
RAW_TARGETS_COLUMN = "targets"


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where a pipeline's raw data comes from: CSV/Parquet files, or a loader returning a frame."""

    paths: tuple[str, ...] = ()  # files or glob patterns; relative ones resolve against the sources root
    loader: Callable[[], pd.DataFrame] | None = None
    csv_options: dict[str, Any] = field(default_factory=dict)
    # Files are read this many MB of parsed cells (8 bytes each) at a time: ingesting holds one
    # chunk, its Great Expectations tables and a few bytes of keys per row, never the whole source.
    chunk_mb: float = 32.0
    # New parts (about split.shard_mb of features each) sharded per Dagster step, a pod each on
    # Kubernetes: assets/table_shard_steps.py. 16 keeps a table under about 1 GB of features one
    # step, as fast as a single-step build; not part of the data version.
    parts_per_step: int = 16
    # Source files parsed, checked and converted per Dagster step of the raw ingest, in the
    # source's order (assets/table_ingest_steps.py); a file is never split. 16 keeps a source of
    # up to 16 files (a day's or a month's of daily files) one step, as fast as before; not part
    # of the data version.
    files_per_step: int = 16

    def describe(self) -> str:
        if self.loader is not None:
            return f"loader {self.loader.__module__}.{getattr(self.loader, '__qualname__', 'loader')}"
        return ", ".join(self.paths)


@dataclass(frozen=True, kw_only=True)
class ImageFolder:
    """Images under ``root`` (relative to the sources root, or the store's ``sources/`` area): one
    sub-folder per class (``root/<class>/<file>``), or listed by a CSV/Parquet ``manifest`` (in
    ``root``) of relative image paths with labels. JPEG, PNG and WebP; grayscale, RGB or RGBA."""

    root: str
    manifest: str | None = None
    path_column: str = "path"  # manifest column of image paths, relative to root
    label_column: str = "label"  # manifest column of labels
    extensions: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".webp")
    min_side: int = 8  # smallest accepted width or height, in pixels
    max_side: int = 8192  # largest accepted width or height (Pillow's bomb limit applies too)
    modes: tuple[str, ...] = ("L", "RGB", "RGBA")  # accepted Pillow modes
    files_per_chunk: int = 512  # images ingested (and checked) at a time: memory stays bounded
    # Images per part, on average: the unit a new version reuses when the folder changes
    # (assets/kinds/image_parts.py). Smaller parts make an edit cheaper and shards at part ends smaller.
    files_per_part: int = 4096
    # New parts ingested, and then sharded, per Dagster step (a pod each on Kubernetes):
    # assets/image_ingest_steps.py, assets/image_shard_steps.py.
    parts_per_step: int = 8

    @property
    def paths(self) -> tuple[str, ...]:
        """Patterns of the files it reads, for the new-data sensor's source area."""
        return (f"{self.root.rstrip('/')}/**",)

    def describe(self) -> str:
        return f"image folder {self.root}" + (f" (manifest {self.manifest})" if self.manifest else "")


@dataclass(frozen=True, kw_only=True)
class TextCorpus:
    """Text files: JSONL with a text field (and optionally a label), or plain ``.txt`` files (one
    document each), for classification or language modelling. Relative paths are read from the
    store's ``sources/`` area or the sources root; absolute paths as they are, with documents
    named under the folder their patterns share."""

    paths: tuple[str, ...]  # files or globs (``**`` crosses folders); .jsonl and .txt; all relative or all absolute
    text_field: str = "text"  # JSONL field holding the text
    label_field: str | None = None  # JSONL field holding the label (classification)
    min_chars: int = 1  # shortest accepted document
    max_chars: int = 10_000_000  # longest accepted document
    docs_per_chunk: int = 2048  # documents ingested (and checked) at a time
    # New parts (preprocessing.part_documents documents each, about) tokenized per Dagster step, a
    # pod each on Kubernetes: assets/text_shard_steps.py. 64 keeps a corpus under about 64,000
    # documents one step, as fast as a single-step build; not part of the data version.
    parts_per_step: int = 64

    def describe(self) -> str:
        return "text corpus " + ", ".join(self.paths)


@dataclass(frozen=True, kw_only=True)
class ImagePreprocessing:
    """How the shards asset turns images into samples; part of the data version (hashed)."""

    size: tuple[int, int] = (64, 64)  # (height, width) of every sample
    fit: str = "center_crop"  # "center_crop" (scale the short side, crop the middle) or "resize" (stretch)
    channels: str = "RGB"  # "RGB" or "L": what every image is converted to
    encoded: bool = False  # keep re-encoded JPEG bytes (decoded by the loader) instead of raw pixels
    jpeg_quality: int = 90  # with encoded=True
    function: str | None = None  # "pkg.module:fn" (PIL.Image -> uint8 HxWxC array) instead of the built-in


@dataclass(frozen=True, kw_only=True)
class TextPreprocessing:
    """How the shards asset turns text into token samples; part of the data version (hashed)."""

    tokenizer: str = "byte"  # "byte" (256 ids, no training) or "bpe" (trained on the training split)
    vocab_size: int = 4096  # with tokenizer="bpe"
    seq_len: int = 128  # tokens per sample (language modelling: windows of seq_len + 1 for the shifted target)
    function: str | None = None  # "pkg.module:fn" (str -> str) applied to every document before tokenizing
    # Documents per part, about (content-defined cuts: a quarter to four times this): the unit a new
    # version keeps or re-tokenizes (assets/kinds/text.py plan_text_parts).
    part_documents: int = 1024
    # BPE only: train the tokenizer again on this version's training split. By default a new version
    # keeps the published version's tokenizer (and so every part whose documents did not change)
    # while tokenizer, vocab_size and function stay the same.
    refit_tokenizer: bool = False


TASKS = ("classification", "regression", "multilabel", "language_modeling")
TABLE_TASKS = ("classification", "regression", "multilabel")
EVALUATE_ON = ("step", "training")  # Recipe.evaluate_on


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How to train: handed to training_runtime as its config."""

    epochs: int = 10
    batch_size: int = 64
    lr: float = 0.01
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    grad_accum_steps: int = 1
    seed: int = 0
    world_size: int = 2  # worker processes per node (torchrun --nproc-per-node)
    nnodes: int = 1
    min_nodes: int | None = None  # elastic gang: trains on min_nodes..nnodes nodes, re-forming from the last checkpoint when one is lost and growing back when it returns (None: fixed at nnodes; docs/elastic-training.md)
    sharding: str = "ddp"
    precision: str = "fp32"
    fsdp_units: str | None = None  # FSDP units: module class names, comma-separated, e.g. "GPT2Block" (None: the platform's blocks for its models, else modules of about fsdp_unit_params parameters)
    fsdp_unit_params: int | None = None  # size of size-based FSDP units, in parameters (None: a sixteenth of the model's)
    activation_checkpointing: bool = False  # recompute each FSDP unit's activations in the backward pass (less memory, one more forward)
    checkpoint_every_steps: int = 50
    keep_last_checkpoints: int = 3
    async_checkpoint: bool = False
    checkpoint_format: str = "auto"  # 'auto' (sharded under fsdp/hsdp), 'full' or 'sharded'
    max_restarts: int = 1
    gpus_per_node: int = 0
    gpu_resource_name: str = "nvidia.com/gpu"
    # Training pod size per GPU on Kubernetes (resources/launch/base.py explains the defaults: 8-GPU
    # H100/H200 nodes). Every pod gets at least 2 CPUs, 8 GiB and 2 GiB of /dev/shm, which is what a
    # CPU-only (gloo) pod gets. Lower them for MIG slices, raise memory for multi-node FSDP.
    cpu_per_gpu: float = 10.0  # CPU cores per GPU: its rank's kernel-launch, NCCL and loader threads
    memory_gib_per_gpu: float = 96.0  # host memory per GPU, GiB: pinned batches; FSDP full state on rank 0
    shm_gib_per_gpu: float = 4.0  # /dev/shm per GPU, GiB (memory-backed: part of memory_gib_per_gpu)
    # Validation during training, early stopping and keep_best (training_runtime ValidationConfig)
    validate_every_steps: int | None = None  # None: at the end of every epoch
    monitor: str | None = None  # validation metric watched, e.g. "loss", "accuracy", "perplexity" (None: the task's)
    monitor_mode: str | None = None  # "min" or "max" (None: the task's default for its metric)
    early_stopping_patience: int | None = None  # validations without improvement before stopping (None: never)
    keep_best: bool = True  # evaluate and register the best validation's weights, not the last
    # Where the test/validation metrics are computed: "step" (the evaluation step, on CPU) or
    # "training" (the training job's rank 0, on its GPU, after training; the step reuses them).
    evaluate_on: str = "step"
    # Seeded image augmentation of the training split
    augment_padding: int = 0  # random crop from the image padded by this many pixels (0: none)
    augment_hflip: bool = False  # mirror half of the images
    # Speed and numerics on GPUs (training_runtime TrainConfig)
    loader_threads: int = 1  # background threads gathering (and decoding) batches per rank
    prefetch_batches: int = 4  # batches prepared ahead of the training step
    grad_clip_norm: float | None = None  # clip the global gradient norm (None: no clipping)
    compile: bool = False  # torch.compile the model
    tf32: bool = True  # fp32 matmuls on TF32 tensor cores (CUDA)
    deterministic: bool = False  # deterministic kernels: a resumed run reproduces an uninterrupted one bit for bit
    collective_timeout_s: float = 600.0  # a hung or dead rank fails the run after this long
    io_timeout_s: float = 3600.0  # waits on one rank's I/O (shard download, checkpoint checks and writes)


@dataclass(frozen=True, kw_only=True)
class QualityGate:
    """A model version is published to main only when it meets every bound.

    ``bounds`` maps an evaluation metric, ``<split>_<metric>`` ("test_perplexity",
    "validation_macro_f1", "test_r2"), to ``{"min": x}`` and/or ``{"max": y}``. The two named fields
    are the classic classification bounds, kept for existing pipelines. ``gate_from(...)`` also
    takes a flat mapping: ``{"min_test_accuracy": 0.9, "test_perplexity": {"max": 12}}``."""

    min_test_accuracy: float = 0.0
    max_test_loss: float | None = None
    bounds: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def all_bounds(self) -> dict[str, dict[str, float]]:
        out = {k: dict(v) for k, v in self.bounds.items()}
        if self.min_test_accuracy:
            out.setdefault("test_accuracy", {})["min"] = self.min_test_accuracy
        if self.max_test_loss is not None:
            out.setdefault("test_loss", {})["max"] = self.max_test_loss
        return out

    def record(self, failures: list[str]) -> dict[str, Any]:
        """What a version's lineage records of the gate: the verdict and only the bounds the pipeline
        (or the run's overrides) set; an unset bound (min_test_accuracy 0.0 of a language model) is no bound."""
        return {"passed": not failures, "failures": list(failures), "bounds": self.all_bounds()}

    def failures(self, evaluation: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """``evaluation``: split -> that split's metrics. A bound on a metric the evaluation lacks fails."""
        out = []
        for key, bound in self.all_bounds().items():
            split, _, metric = key.partition("_")
            value = (evaluation.get(split) or {}).get(metric)
            shown = key.replace("_", " ", 1)
            if not isinstance(value, (int, float)):
                out.append(f"{shown}: the evaluation has no such metric (it has "
                           f"{sorted((evaluation.get(split) or {}))})")
                continue
            if "min" in bound and value < bound["min"]:
                out.append(f"{shown} {value:.4f} is below the gate's minimum {bound['min']}")
            if "max" in bound and value > bound["max"]:
                out.append(f"{shown} {value:.4f} is above the gate's maximum {bound['max']}")
        return out


def gate_from(pipeline: str, value: Any) -> QualityGate:
    """A QualityGate from itself, None, or a mapping of its fields and/or metric bounds."""
    if value is None:
        return QualityGate()
    if isinstance(value, QualityGate):
        return value
    if not isinstance(value, Mapping):
        _fail(pipeline, "gate", f"{value!r} must be a QualityGate or a mapping such as "
              "{'test_accuracy': {'min': 0.9}}")
    named = {k: v for k, v in value.items() if k in ("min_test_accuracy", "max_test_loss")}
    bounds = {k: v for k, v in value.items() if k not in named and k != "bounds"}
    bounds.update(value.get("bounds") or {})
    for key, bound in bounds.items():
        split = key.partition("_")[0]
        if split not in ("test", "validation") or "_" not in key:
            _fail(pipeline, f"gate.{key}", "name a metric as <split>_<metric> with split 'test' or 'validation', "
                  "e.g. 'test_accuracy' or 'test_perplexity'")
        if not isinstance(bound, Mapping) or not bound or set(bound) - {"min", "max"} or not all(
                isinstance(b, (int, float)) and not isinstance(b, bool) for b in bound.values()):
            _fail(pipeline, f"gate.{key}", f"{bound!r} must be {{'min': number}} and/or {{'max': number}}")
    try:
        return QualityGate(**named, bounds={k: dict(v) for k, v in bounds.items()})
    except TypeError as exc:
        _fail(pipeline, "gate", str(exc))


@dataclass(frozen=True, kw_only=True)
class Split:
    """How samples are split and cut into shard files.

    Shards are sized in bytes by default (``shard_mb``, 64 MB like MosaicML streaming's MDS
    writer): the loader gathers a shuffled batch with one copy per shard it touches, so a batch
    of small samples spread over many small shards pays per-shard overhead for a handful of rows
    each. ``samples_per_shard`` fixes the count instead (small datasets that should still span
    several shards, tests).
    """

    seed: int = 0
    train: float = 0.8
    validation: float = 0.1
    test: float = 0.1
    shard_mb: float = 64.0
    samples_per_shard: int | None = None

    def shard_samples(self, sample_bytes: int) -> int:
        """Samples per shard for samples of ``sample_bytes`` bytes each (features and label)."""
        if self.samples_per_shard is not None:
            return self.samples_per_shard
        return max(1, int(self.shard_mb * 2**20) // sample_bytes)


@dataclass(frozen=True, kw_only=True)
class QualitySuite:
    """Great Expectations suites for the raw dataset and the shards, written in Python.

    Each is a function of the pipeline's spec returning ``{table: [gx expectation, ...]}``; the
    tables are listed in ``assets/quality/tables.py`` (raw: ``rows``, ``classes``; shards:
    ``samples``, ``splits``). Functions import Great Expectations themselves, so loading
    definitions stays light.
    """

    raw: Callable[["PipelineSpec"], Mapping[str, Sequence[Any]]] | None = None
    shards: Callable[["PipelineSpec"], Mapping[str, Sequence[Any]]] | None = None

    @classmethod
    def standard(cls) -> "QualitySuite":
        return cls(raw=standard_raw_expectations, shards=standard_shard_expectations)


@dataclass(frozen=True, kw_only=True)
class Triggers:
    """When a pipeline retrains: on a cron schedule, and/or when new source data lands on ``main``."""

    cron: str | None = None  # e.g. "0 3 * * 1"; None: no schedule
    timezone: str = "UTC"
    on_new_data: bool = True  # sensor on the store's sources/ area (or, for shared data, the shards)
    sensor_interval_s: int = 60
    active: bool = False  # start the schedule and sensor as running (otherwise turn them on in the UI)


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    name: str
    source: Source | ImageFolder | TextCorpus | None = None
    dataset: str | None = None  # another pipeline's name: train on its shards instead of a source
    preprocessing: ImagePreprocessing | TextPreprocessing | None = None  # images and text (tables: normalisation)
    task: str = "classification"  # what the targets are (classification, regression, multilabel, language_modeling)
    # The code location that publishes ``dataset`` when it is not this one's (another team's):
    # training then reads its shards as published on main, never the owner's unpublished runs.
    dataset_location: str | None = None
    # Pin another location's dataset to one published version (tag "<dataset>-d<N>"); None: the newest.
    dataset_version: str | None = None
    location: str = "platform"  # the code location that defines this pipeline (set by its definitions)
    feature_columns: tuple[str, ...] = ()
    label_column: str = ""
    class_names: tuple[str, ...] = ()  # classification: the classes; multilabel: the label columns' names
    # task="multilabel": one 0/1 source column per label (label_column stays empty)
    label_columns: tuple[str, ...] = ()
    # task="regression": inclusive (low, high) every target must lie in; None: any finite number
    target_range: tuple[float, float] | None = None
    id_column: str | None = None
    expectations: QualitySuite = field(default_factory=QualitySuite.standard)
    triggers: Triggers = field(default_factory=Triggers)
    team: str = "ml"
    model: str | None = "mlp"  # None: a dataset pipeline (raw_dataset and shards only; see dataset_pipeline)
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    train: str | None = None  # "package.module:function" run on every rank instead of the built-in loop
    recipe: Recipe = field(default_factory=Recipe)
    # What watches the training (hang watchdog, non-finite stop, stalls, stragglers, GPU health):
    # the runtime's GuardsConfig, handed to it as its ``guards`` (training_runtime/config.py).
    guards: Guards = field(default_factory=Guards)
    placement: Placement = field(default_factory=Placement)  # where training pods run (core/placement.py)
    gate: QualityGate = field(default_factory=QualityGate)
    split: Split = field(default_factory=Split)
    feature_shape: tuple[int, ...] | None = None  # defaults to (len(feature_columns),)
    description: str = ""
    sweep: Any = None  # a core.sweep.Sweep: search these settings for the best validation metric
    owner_fields_filled: bool = field(default=False, repr=False)  # set by sharing(), not by users

    def __post_init__(self) -> None:
        n = self.name
        if not isinstance(n, str) or not _NAME.fullmatch(n):
            _fail(str(n), "name", "use 1-63 lowercase letters, digits and '_', starting with a letter")
        self._check_common(n)
        if self.dataset is not None:
            if not self.owner_fields_filled:
                self._check_shared(n)
            return
        if isinstance(self.source, (ImageFolder, TextCorpus)):
            self._check_typed_source(n)
            return
        if self.preprocessing is not None:
            _fail(n, "preprocessing", "applies to image folders and text corpora; table features are normalised "
                  "with the training split's mean and standard deviation")
        if self.task not in TABLE_TASKS:
            _fail(n, "task", "'language_modeling' reads token sequences from a TextCorpus source; a table's rows "
                  f"hold no text. Use one of {list(TABLE_TASKS)} on a table" if self.task == "language_modeling"
                  else f"{self.task!r} is not a task; a table takes one of {list(TABLE_TASKS)}")
        if self.source is None or (not self.source.paths and self.source.loader is None):
            _fail(n, "source", "give file paths/globs (CSV or Parquet), a loader function, or dataset=<pipeline>")
        if self.expectations.raw is None or self.expectations.shards is None:
            _fail(n, "expectations", "the expectation suite is empty; give raw and shards suites "
                  "(QualitySuite.standard() is a start)")
        if not self.feature_columns:
            _fail(n, "feature_columns", "list at least one feature column")
        if len(set(self.feature_columns)) != len(self.feature_columns):
            _fail(n, "feature_columns", "a column is listed twice")
        self._check_table_targets(n)
        fractions = (self.split.train, self.split.validation, self.split.test)
        if any(f <= 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
            _fail(n, "split", f"train/validation/test fractions must be positive and sum to 1, got {fractions}")
        if self.split.samples_per_shard is not None and self.split.samples_per_shard < 1:
            _fail(n, "split.samples_per_shard", "must be at least 1 (or None to size shards by split.shard_mb)")
        if not self.split.shard_mb > 0:
            _fail(n, "split.shard_mb", f"must be positive, got {self.split.shard_mb}")
        if not self.source.chunk_mb > 0:
            _fail(n, "source.chunk_mb", f"must be positive, got {self.source.chunk_mb}")
        if not isinstance(self.source.parts_per_step, int) or self.source.parts_per_step < 1:
            _fail(n, "source.parts_per_step", f"{self.source.parts_per_step!r}: give a whole number of parts a step, "
                  "at least 1")
        if not isinstance(self.source.files_per_step, int) or self.source.files_per_step < 1:
            _fail(n, "source.files_per_step", f"{self.source.files_per_step!r}: give a whole number of files a step, "
                  "at least 1")
        if self.feature_shape is not None:
            size = 1
            for d in self.feature_shape:
                size *= d
            if size != len(self.feature_columns):
                _fail(n, "feature_shape", f"{self.feature_shape} holds {size} values but there are "
                      f"{len(self.feature_columns)} feature columns")

    def _check_table_targets(self, n: str) -> None:
        """The column(s) a table's task reads its targets from: class labels, a numeric target, or one
        0/1 column per label (whose names become ``class_names``)."""
        task = self.task
        if task != "multilabel" and self.label_columns:
            _fail(n, "label_columns", f"applies to task 'multilabel' (one 0/1 column per label); task {task!r} "
                  "reads one label column: give label=<column>")
        if task != "regression" and self.target_range is not None:
            _fail(n, "target_range", f"bounds regression targets; task {task!r} has none. Leave it out")
        if task == "multilabel":
            field_name, targets = "label_columns", tuple(self.label_columns)
            if self.label_column:
                _fail(n, "label_column", "a multi-label table reads one 0/1 column per label from label_columns "
                      "(labels=('a', 'b', ...)); leave label out")
            if not targets:
                _fail(n, "label_columns", "give the 0/1 column of each label (labels=('a', 'b', ...))")
            if len(set(targets)) != len(targets):
                _fail(n, "label_columns", "a column is listed twice")
            if self.class_names and tuple(self.class_names) != targets:
                _fail(n, "class_names", "a multi-label table's class names are its label columns; leave classes out")
            object.__setattr__(self, "class_names", targets)  # frozen: set once, while validating
        else:
            field_name, targets = "label_column", (self.label_column,)
            if task == "regression":
                if not self.label_column:
                    _fail(n, "label_column", "name the column holding each row's numeric target (label=<column>)")
                if self.class_names:
                    _fail(n, "class_names", "a regression target is a number, not a class; leave classes out "
                          "(target_range=(low, high) bounds it)")
                self._check_target_range(n)
        for column in targets:
            if column in self.feature_columns:
                _fail(n, field_name, f"{column!r} is also a feature column")
            if self.id_column is not None and column == self.id_column:
                _fail(n, field_name, f"{column!r} is also the id column")
        if RAW_FEATURES_COLUMN in (*targets, self.id_column):
            _fail(n, f"{field_name}/id_column", f"{RAW_FEATURES_COLUMN!r} names the raw copy's feature column; rename "
                  "the column (e.g. with the source's csv_options or the loader)")
        if task == "multilabel" and self.id_column == RAW_TARGETS_COLUMN:
            _fail(n, "id_column", f"{RAW_TARGETS_COLUMN!r} names the raw copy's label column of a multi-label table; "
                  "rename the column (e.g. with the source's csv_options or the loader)")
        if task == "classification":
            if not self.label_column:
                _fail(n, "label_column", "name the column holding each row's class (label=<column>)")
            if len(self.class_names) < 2 or len(set(self.class_names)) != len(self.class_names):
                _fail(n, "class_names", "give at least two distinct class names")

    def _check_target_range(self, n: str) -> None:
        bounds = self.target_range
        if bounds is None:
            return
        try:
            low, high = (float(b) for b in bounds)
        except (TypeError, ValueError):
            _fail(n, "target_range", f"{bounds!r} must be two numbers (low, high)")
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            _fail(n, "target_range", f"{bounds!r} must be two finite numbers with low < high")
        object.__setattr__(self, "target_range", (low, high))  # frozen: set once, while validating

    def _check_typed_source(self, n: str) -> None:
        """Image folders and text corpora: their own fields instead of feature and label columns."""
        src = self.source
        image = isinstance(src, ImageFolder)
        wanted = ImagePreprocessing if image else TextPreprocessing
        if self.preprocessing is not None and not isinstance(self.preprocessing, wanted):
            _fail(n, "preprocessing", f"a {type(src).__name__} source takes {wanted.__name__}, got "
                  f"{type(self.preprocessing).__name__}")
        taken = [f for f in ("feature_columns", "label_column", "feature_shape") if getattr(self, f)]
        if taken:
            _fail(n, taken[0], f"does not apply to a {type(src).__name__} source (its samples come from "
                  "preprocessing); leave it out")
        if self.task not in TASKS:
            _fail(n, "task", f"{self.task!r} is not a task; choose one of {list(TASKS)}")
        prep = self.preprocessing or wanted()
        if prep.function is not None and not re.fullmatch(r"[\w.]+:[\w.]+", prep.function):
            _fail(n, "preprocessing.function", f"{prep.function!r} must look like 'package.module:function'")
        if image:
            self._check_images(n, src, prep)
        else:
            self._check_text(n, src, prep)

    def _check_images(self, n: str, src: "ImageFolder", prep: "ImagePreprocessing") -> None:
        if self.task != "classification":
            _fail(n, "task", f"{self.task!r} on images is not built yet; image folders are classified")
        if not src.root or src.root.startswith("/") or ".." in src.root.split("/"):
            _fail(n, "source.root", f"{src.root!r} must be a folder under the sources root (relative, no '..')")
        if len(self.class_names) < 2 or len(set(self.class_names)) != len(self.class_names):
            _fail(n, "class_names", "give at least two distinct class names (the class folders' names, or the "
                  "manifest's labels)")
        if len(prep.size) != 2 or min(prep.size) < 1:
            _fail(n, "preprocessing.size", f"{prep.size} must be (height, width), both at least 1")
        if prep.fit not in ("center_crop", "resize"):
            _fail(n, "preprocessing.fit", f"{prep.fit!r}: use 'center_crop' or 'resize'")
        if prep.channels not in ("RGB", "L"):
            _fail(n, "preprocessing.channels", f"{prep.channels!r}: use 'RGB' or 'L'")
        if not 1 <= prep.jpeg_quality <= 100:
            _fail(n, "preprocessing.jpeg_quality", "must lie between 1 and 100")
        if not 1 <= src.min_side <= src.max_side:
            _fail(n, "source.min_side", f"need 1 <= min_side ({src.min_side}) <= max_side ({src.max_side})")
        for field_name in ("files_per_chunk", "files_per_part", "parts_per_step"):
            if not isinstance(getattr(src, field_name), int) or getattr(src, field_name) < 1:
                _fail(n, f"source.{field_name}", f"{getattr(src, field_name)!r}: give a whole number of images, "
                      "at least 1")

    def _check_text(self, n: str, src: "TextCorpus", prep: "TextPreprocessing") -> None:
        if not src.paths:
            _fail(n, "source.paths", "give .jsonl or .txt files or globs under the sources root")
        absolute = [p for p in src.paths if p.startswith("/")]
        if absolute and len(absolute) < len(src.paths):
            _fail(n, "source.paths", f"mixes absolute paths ({absolute[0]!r}) with paths under the sources root; "
                  "a corpus names its documents under one folder: make them all absolute or all relative")
        if self.task == "language_modeling":
            if self.class_names or src.label_field:
                _fail(n, "class_names" if self.class_names else "source.label_field",
                      "a language-modelling corpus has no labels; leave it out")
        elif self.task == "classification":
            if not src.label_field:
                _fail(n, "source.label_field", "text classification reads labels from a JSONL field; name it")
            if len(self.class_names) < 2 or len(set(self.class_names)) != len(self.class_names):
                _fail(n, "class_names", "give at least two distinct class names")
        else:
            _fail(n, "task", f"{self.task!r} on text is not built yet; use 'language_modeling' or 'classification'")
        if prep.tokenizer not in ("byte", "bpe"):
            _fail(n, "preprocessing.tokenizer", f"{prep.tokenizer!r}: use 'byte' or 'bpe'")
        if prep.seq_len < 2:
            _fail(n, "preprocessing.seq_len", "must be at least 2")
        if prep.part_documents < 1:
            _fail(n, "preprocessing.part_documents", "must be at least 1 document")
        if not isinstance(src.parts_per_step, int) or src.parts_per_step < 1:
            _fail(n, "source.parts_per_step", f"{src.parts_per_step!r}: give a whole number of parts a step, at least 1")
        if prep.tokenizer == "bpe" and prep.vocab_size < 300:
            _fail(n, "preprocessing.vocab_size", "a BPE vocabulary needs at least 300 tokens (256 bytes and merges)")
        if not 0 < src.min_chars <= src.max_chars:
            _fail(n, "source.min_chars", f"need 0 < min_chars ({src.min_chars}) <= max_chars ({src.max_chars})")

    def _check_shared(self, n: str) -> None:
        if not isinstance(self.dataset, str) or not _NAME.fullmatch(self.dataset) or self.dataset == n:
            _fail(n, "dataset", f"{self.dataset!r} must name another pipeline")
        if self.dataset_location is not None and not _LOCATION.fullmatch(self.dataset_location):
            _fail(n, "dataset_location", f"{self.dataset_location!r} is not a code location name; use letters, "
                  "digits, '_' and '-'")
        if self.dataset_version is not None:
            if self.dataset_location is None:
                _fail(n, "dataset_version", "pins a dataset another code location publishes; give dataset_location "
                      "too (a dataset of this location is trained on the commit its own run produces)")
            if not re.fullmatch(rf"{re.escape(self.dataset)}-d[1-9]\d*", self.dataset_version):
                _fail(n, "dataset_version", f"{self.dataset_version!r} is not a version of {self.dataset!r}; "
                      f"use its tag, e.g. '{self.dataset}-d1' (python -m pipelines datasets {self.dataset} lists them)")
        taken = [f for f in ("source", "feature_columns", "label_column", "class_names", "id_column",
                             "feature_shape", "label_columns", "target_range", "preprocessing") if getattr(self, f)]
        if taken:
            _fail(n, taken[0], f"comes from the shared dataset {self.dataset!r}; leave it out")

    def _check_common(self, n: str) -> None:
        if not isinstance(self.location, str) or not _LOCATION.fullmatch(self.location):
            _fail(n, "location", f"{self.location!r} is not a code location name; use letters, digits, '_' and '-'")
        if self.dataset is None and (self.dataset_location or self.dataset_version):
            _fail(n, "dataset_location" if self.dataset_location else "dataset_version",
                  "applies only to a pipeline that trains on another pipeline's dataset (dataset=...)")
        r = self.recipe
        for fname in ("epochs", "batch_size", "world_size", "nnodes", "grad_accum_steps", "checkpoint_every_steps",
                      "keep_last_checkpoints"):
            if getattr(r, fname) < 1:
                _fail(n, f"recipe.{fname}", "must be at least 1")
        if r.lr <= 0:
            _fail(n, "recipe.lr", "must be positive")
        self._check_elastic(n)
        if not 0.0 <= self.gate.min_test_accuracy <= 1.0:
            _fail(n, "gate.min_test_accuracy", "must lie between 0 and 1")
        self._check_training_fields(n)
        if r.gpus_per_node < 0:
            _fail(n, "recipe.gpus_per_node", "must be 0 (CPU) or more")
        from resources.launch.base import pod_sizing_problems  # the sizing rules live beside GpuRequest

        for fname, problem in pod_sizing_problems(cpu_per_gpu=r.cpu_per_gpu, memory_gib_per_gpu=r.memory_gib_per_gpu,
                                                  shm_gib_per_gpu=r.shm_gib_per_gpu):
            _fail(n, f"recipe.{fname}", problem)
        for fname, problem in placement_problems(
                self.placement, gpus_per_node=r.gpus_per_node, gpu_resource_name=r.gpu_resource_name,
                cpu_per_gpu=r.cpu_per_gpu, memory_gib_per_gpu=r.memory_gib_per_gpu, shm_gib_per_gpu=r.shm_gib_per_gpu):
            _fail(n, fname, problem)
        if not _NAME.fullmatch(self.team or ""):
            _fail(n, "team", "use lowercase letters, digits and '_'")
        if self.model is None:
            if self.dataset is not None:
                _fail(n, "model", "a pipeline that trains on another pipeline's dataset needs a model")
        else:
            _check_model_name(n, self.model)
        if self.sweep is not None:
            from core.sweep import Sweep, check_sweep

            if not isinstance(self.sweep, Sweep):
                _fail(n, "sweep", f"{self.sweep!r} must be a Sweep (model_pipeline also takes a mapping)")
            check_sweep(self)
        if self.triggers.cron is not None:
            from dagster._utils.schedules import is_valid_cron_string

            if not is_valid_cron_string(self.triggers.cron):
                _fail(n, "triggers.cron", f"{self.triggers.cron!r} is not a cron expression")

    def _check_elastic(self, n: str) -> None:
        """An elastic gang's every size must split the global batch: the batch (summed over ranks and
        accumulation steps) stays the same at every size, so the loss curve does not depend on it."""
        r = self.recipe
        if r.min_nodes is None:
            return
        if not isinstance(r.min_nodes, int) or not 1 <= r.min_nodes <= r.nnodes:
            _fail(n, "recipe.min_nodes", f"must be between 1 and nnodes ({r.nnodes}), got {r.min_nodes!r}; "
                                         "leave it out for a gang of fixed size")
        if r.sharding == "hsdp" and r.min_nodes < r.nnodes:
            _fail(n, "recipe.sharding", "'hsdp' replicates over a node grid fixed at launch and cannot resize; use "
                                        "'fsdp' or 'ddp' for an elastic gang, or leave min_nodes out")
        if r.max_restarts < 1:
            _fail(n, "recipe.max_restarts", "an elastic gang re-forms by restarting its workers: give at least 1 "
                                            "(each lost node uses one restart)")
        from training_runtime.distributed.elastic import world_sizes  # stdlib only

        per_node = r.gpus_per_node or r.world_size
        bad = [w for w in world_sizes(r.min_nodes, r.nnodes, per_node) if r.batch_size % (w * r.grad_accum_steps)]
        if bad:
            sizes = world_sizes(r.min_nodes, r.nnodes, per_node)
            step = math.lcm(*sizes) * r.grad_accum_steps
            _fail(n, "recipe.batch_size", f"{r.batch_size} is not divisible by world size {bad[0]} x grad_accum_steps "
                                          f"({r.grad_accum_steps}); an elastic gang of {r.min_nodes}-{r.nnodes} nodes "
                                          f"runs at world sizes {sizes}, so choose a multiple of {step}")

    def _check_training_fields(self, n: str) -> None:
        """The task, a user training function, validation settings and the gate's metrics."""
        from training_runtime.tasks.names import OPTIONAL_METRICS, TASK_METRICS  # without importing torch

        custom_task = ":" in self.task
        if custom_task and not re.fullmatch(r"[\w.]+:[\w.]+", self.task):
            _fail(n, "task", f"{self.task!r} must be a built-in task {list(TASKS)} or 'package.module:TaskClass'")
        if self.train is not None:
            if self.model is None:
                _fail(n, "train", "a dataset pipeline does not train; give a model too (the function may ignore it)")
            if not re.fullmatch(r"[\w.]+:[\w.]+", self.train):
                _fail(n, "train", f"{self.train!r} must look like 'package.module:function'")
        for fname, path in (("task", self.task if custom_task else None), ("train", self.train),
                            ("model", self.model if self.model and ":" in self.model else None)):
            if path is not None:
                _check_module_exists(n, fname, path)
        r = self.recipe
        for fname in ("validate_every_steps", "early_stopping_patience", "fsdp_unit_params"):
            if getattr(r, fname) is not None and getattr(r, fname) < 1:
                _fail(n, f"recipe.{fname}", "must be at least 1 (or None)")
        if r.monitor_mode not in (None, "min", "max"):
            _fail(n, "recipe.monitor_mode", f"{r.monitor_mode!r}: use 'min', 'max' or None")
        if r.evaluate_on not in EVALUATE_ON:
            _fail(n, "recipe.evaluate_on", f"{r.evaluate_on!r}: use 'step' (the evaluation step, on CPU) or "
                  "'training' (the training job, on its GPUs)")
        if r.augment_padding < 0:
            _fail(n, "recipe.augment_padding", "must be 0 or more")
        for fname in ("loader_threads", "prefetch_batches"):
            if getattr(r, fname) < 1:
                _fail(n, f"recipe.{fname}", "must be at least 1")
        for fname in ("grad_clip_norm", "collective_timeout_s", "io_timeout_s"):
            value = getattr(r, fname)
            if value is not None and not (value > 0 and math.isfinite(value)):
                _fail(n, f"recipe.{fname}", f"{value!r}: must be a positive number" +
                      (" (or None)" if fname == "grad_clip_norm" else " of seconds"))
        self._check_guards(n)
        for fname, problem in fsdp_problems(sharding=r.sharding, fsdp_units=r.fsdp_units, section="recipe",
                                            fsdp_unit_params=r.fsdp_unit_params,
                                            activation_checkpointing=r.activation_checkpointing):
            _fail(n, f"recipe.{fname}", problem)
        if (r.augment_padding or r.augment_hflip) and not isinstance(self.source, ImageFolder) and self.dataset is None:
            _fail(n, "recipe.augment_padding" if r.augment_padding else "recipe.augment_hflip",
                  "augments images; this pipeline's data is not an image folder")
        if custom_task or self.task not in TASK_METRICS or self.model is None:
            return  # a custom task's metrics are known when it is imported, at the start of training
        if self.dataset is not None and self.dataset_location is None and not self.owner_fields_filled:
            return  # the task comes from the dataset's owner: checked again once sharing() fills it in
        known = TASK_METRICS[self.task] + OPTIONAL_METRICS[self.task]
        if r.monitor is not None and r.monitor not in known:
            _fail(n, "recipe.monitor", f"{r.monitor!r} is not a metric of task {self.task!r}; it has {list(known)}")
        for key in self.gate.all_bounds():
            metric = key.partition("_")[2]
            if metric not in known:
                _fail(n, f"gate.{key}", f"task {self.task!r} does not produce {metric!r}; its metrics are "
                      f"{list(known)} (as test_<metric> or validation_<metric>)")

    def _check_guards(self, n: str) -> None:
        """The runtime's own rules (training_runtime.config.guard_problems), in the pipeline's words."""
        if not isinstance(self.guards, Guards):
            _fail(n, "guards", f"{self.guards!r} must be a Guards (model_pipeline also takes a mapping of its fields)")
        for fname, problem in guard_problems(self.guards, collective_timeout_s=self.recipe.collective_timeout_s,
                                             collective_field="recipe.collective_timeout_s", train_fn=self.train):
            _fail(n, f"guards.{fname}", problem)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.feature_shape or (len(self.feature_columns),)

    @property
    def chunk_rows(self) -> int:
        """Source rows per chunk when ingesting and sharding (features, label and id columns)."""
        return max(1, int(self.source.chunk_mb * 2**20) // (8 * (len(self.feature_columns) + len(self.target_columns)
                                                                 + 1)))

    @property
    def target_columns(self) -> tuple[str, ...]:
        """The source columns a table's targets come from: the label column, or a multi-label
        table's 0/1 columns."""
        return tuple(self.label_columns) if self.task == "multilabel" else (self.label_column,)

    @property
    def dataset_name(self) -> str:
        """Whose raw data and shards this pipeline trains on (its own name unless shared)."""
        return self.dataset or self.name

    @property
    def trains(self) -> bool:
        """False for a dataset pipeline: it publishes data that other pipelines train on."""
        return self.model is not None

    @property
    def published_elsewhere(self) -> bool:
        """Trains on a dataset another code location publishes (read from the store, not this location)."""
        return self.dataset is not None and self.dataset_location is not None

    @property
    def gpus(self) -> int:
        """GPU units one training run takes from the cluster's capacity."""
        return self.recipe.gpus_per_node * self.recipe.nnodes if self.trains else 0

    def sharing(self, owner: "PipelineSpec") -> "PipelineSpec":
        """This spec with the data fields of the pipeline that owns its dataset."""
        if owner.dataset is not None:
            _fail(self.name, "dataset", f"{owner.name!r} itself trains on shared data; name the owner "
                  f"{owner.dataset!r} instead")
        # The data decides the task; a custom Task (an import path) names its own.
        task = self.task if ":" in self.task else owner.task
        return replace(self, feature_columns=owner.feature_columns, label_column=owner.label_column,
                       class_names=owner.class_names, id_column=owner.id_column, feature_shape=owner.feature_shape,
                       label_columns=owner.label_columns, target_range=owner.target_range,
                       split=owner.split, task=task, owner_fields_filled=True)


def resolve_shared(specs: Sequence[PipelineSpec]) -> list[PipelineSpec]:
    """Fill in shared-dataset pipelines from their owners; refuse duplicates and unknown owners."""
    names = [s.name for s in specs]
    for spec in specs:
        if names.count(spec.name) > 1:
            _fail(spec.name, "name", "is defined twice; each pipeline needs its own name "
                  "(pipeline names are also asset key prefixes)")
    by_name = {s.name: s for s in specs}
    out = []
    for spec in specs:
        if spec.dataset is None:
            out.append(spec)
        elif spec.dataset_location is not None:
            if spec.dataset in by_name and spec.dataset_location == by_name[spec.dataset].location:
                _fail(spec.name, "dataset_location", f"{spec.dataset!r} is defined in this code location "
                      f"({spec.dataset_location!r}); leave dataset_location out")
            out.append(spec)  # read as published on main; its owner's fields are in the shard manifest
        elif spec.dataset not in by_name:
            _fail(spec.name, "dataset", f"no pipeline named {spec.dataset!r} in this code location; known: "
                  f"{sorted(by_name)}. If another team's code location publishes it, add "
                  "dataset_location='<that location>'")
        else:
            out.append(spec.sharing(by_name[spec.dataset]))
    return out


def model_pipeline(
    name: str, *, source: str | Sequence[str] | Callable[[], pd.DataFrame] | Source | None = None,
    dataset: str | None = None, dataset_location: str | None = None, dataset_version: str | None = None,
    features: Sequence[str] = (), label: str = "", classes: Sequence[Any] = (),
    id_column: str | None = None, expectations: QualitySuite | None = None, model: str | None = "mlp",
    model_kwargs: Mapping[str, Any] | None = None, recipe: Recipe | Mapping[str, Any] | None = None,
    gate: QualityGate | Mapping[str, Any] | None = None, triggers: Triggers | Mapping[str, Any] | None = None,
    feature_shape: Sequence[int] | None = None, split: Split | Mapping[str, Any] | None = None,
    team: str = "ml", description: str = "",
    preprocessing: ImagePreprocessing | TextPreprocessing | None = None, task: str = "classification",
    labels: Sequence[str] = (), target_range: tuple[float, float] | None = None, train: str | None = None,
    placement: Placement | Mapping[str, Any] | None = None, sweep: Any = None,
    guards: Guards | Mapping[str, Any] | None = None,
) -> PipelineSpec:
    """Declare a model pipeline: raw_dataset -> shards -> checkpoint -> model_version.

    ``source`` is a path/glob (or several) of CSV/Parquet files under the sources root, a
    function returning a DataFrame, or a ``Source``; ``dataset="other"`` trains on another
    pipeline's shards instead (then leave out source, features, label and classes); when another
    team's code location publishes that dataset, ``dataset_location`` names it and training reads
    the newest published version, or the one ``dataset_version`` (``"<dataset>-d<N>"``) pins. ``model`` is
    a registry name (``mlp``, ``cnn``, ``resnet``, ``transformer``, ``transformer_lm``,
    ``text_transformer``) or ``"package.module:factory"``; ``train="package.module:main"`` runs your
    own training function on every rank with a ``TrainingContext`` instead of the built-in loop.
    ``task`` may also be ``"package.module:TaskClass"`` (your loss, metrics and predictions). A table's ``task`` is ``"classification"`` (``label`` and ``classes``), ``"regression"``
    (``label`` names a numeric column; ``target_range=(low, high)`` bounds it) or ``"multilabel"``
    (``labels`` names one 0/1 column per label). ``recipe``, ``gate``, ``triggers``, ``split`` and
    ``guards`` take the dataclasses or plain dicts of their fields; ``guards`` (a ``Guards``:
    ``hang_timeout_s``, ``nonfinite_skip_batches``, ``data_stall_share``, ...) sets what watches
    every training, the runtime's own settings (their descriptions: ``training_runtime/config.py``). ``sweep`` (a ``core.sweep.Sweep`` or its
    fields as a dict) makes every training of the pipeline a search: Optuna trials, the best one
    evaluated and registered. ``build_definitions`` turns the returned
    spec into assets with blocking Great Expectations checks, a training job, a schedule and a
    new-data sensor. Mistakes raise ``PipelineDefinitionError`` naming the pipeline and the field
    when definitions load.
    """
    if isinstance(source, str):
        source = Source(paths=(source,))
    elif callable(source) and not isinstance(source, (Source, ImageFolder, TextCorpus)):
        source = Source(loader=source)
    elif source is not None and not isinstance(source, (Source, ImageFolder, TextCorpus)):
        source = Source(paths=tuple(source))
    return PipelineSpec(
        name=name, source=source, dataset=dataset, dataset_location=dataset_location, dataset_version=dataset_version,
        feature_columns=tuple(features), label_column=label,
        class_names=tuple(str(c) for c in classes), id_column=id_column,
        expectations=expectations if expectations is not None else QualitySuite.standard(),
        model=model, model_kwargs=dict(model_kwargs or {}),
        recipe=_coerce(name, "recipe", Recipe, recipe), gate=gate_from(name, gate),
        triggers=_coerce(name, "triggers", Triggers, triggers), split=_coerce(name, "split", Split, split),
        feature_shape=tuple(feature_shape) if feature_shape else None, team=team, description=description,
        preprocessing=preprocessing, task=task, label_columns=tuple(labels),
        target_range=tuple(target_range) if isinstance(target_range, (list, tuple)) else target_range, train=train,
        placement=_coerce(name, "placement", Placement, placement), sweep=_sweep(name, sweep),
        guards=_coerce(name, "guards", Guards, guards),
    )


def _sweep(pipeline: str, value: Any) -> Any:
    from core.sweep import sweep_from

    return sweep_from(pipeline, value)


def _coerce(pipeline: str, field_name: str, cls: type, value: Any) -> Any:
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    try:
        return cls(**dict(value))
    except TypeError as exc:
        _fail(pipeline, field_name, f"{exc}; the fields are {[f.name for f in fields(cls)]}")


def _check_module_exists(pipeline: str, field_name: str, path: str) -> None:
    """The module of an import path must exist. It is found, not imported: definitions load in every
    Dagster process, and user training code imports torch (the training op imports it, and checks
    the attribute and its signature, before any worker starts)."""
    import importlib.util

    module = path.partition(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        found, why = None, f" ({exc})"
    else:
        why = ""
    if found is None:
        _fail(pipeline, field_name, f"{path!r}: no module {module!r} can be imported{why}; check the import path "
              "and that its package is installed in the code location (and in the training image)")


def _check_model_name(pipeline: str, model: str) -> None:
    from training_runtime.models.names import BUILTIN_MODELS  # without importing torch

    if ":" in model:
        module, _, attr = model.partition(":")
        if not module or not attr:
            _fail(pipeline, "model", f"import path {model!r} must look like 'package.module:factory'")
        return
    if model not in BUILTIN_MODELS:
        _fail(pipeline, "model", f"unknown model {model!r}; choose one of {list(BUILTIN_MODELS)} "
              "or give an import path 'package.module:factory'")


def dataset_pipeline(
    name: str, *, source: str | Sequence[str] | Callable[[], pd.DataFrame] | Source | ImageFolder | TextCorpus,
    features: Sequence[str] = (), label: str = "", classes: Sequence[Any] = (), id_column: str | None = None,
    expectations: QualitySuite | None = None, triggers: Triggers | Mapping[str, Any] | None = None,
    feature_shape: Sequence[int] | None = None, split: Split | Mapping[str, Any] | None = None, team: str = "ml",
    description: str = "", preprocessing: ImagePreprocessing | TextPreprocessing | None = None,
    task: str = "classification", labels: Sequence[str] = (), target_range: tuple[float, float] | None = None,
) -> PipelineSpec:
    """Declare a dataset alone: raw_dataset -> shards, for pipelines that name it as their ``dataset``
    (in this code location, or in others with ``dataset_location``). Its job ingests, shards and
    retrains every pipeline of this location that trains on it; its schedule and new-data sensor
    start that job. Fields as in ``model_pipeline``; an ``ImageFolder`` or ``TextCorpus`` source
    takes ``preprocessing`` (``ImagePreprocessing`` / ``TextPreprocessing``) and ``task`` instead
    of feature and label columns."""
    return model_pipeline(name, source=source, features=features, label=label, classes=classes,
                          id_column=id_column, expectations=expectations, model=None, triggers=triggers,
                          feature_shape=feature_shape, split=split, team=team, description=description,
                          preprocessing=preprocessing, task=task, labels=labels, target_range=target_range)
