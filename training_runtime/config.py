"""Typed run configuration. ``RunConfig.from_dict`` validates everything before any training starts
and every error names the field to change."""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from training_runtime.data.sampling import SAMPLE_ORDERS

SHARD_FORMAT = "model-factory.shards/v1"
SHARD_FORMAT_V2 = "model-factory.shards/v2"
OPTIMIZERS = ("adamw", "sgd")
LR_SCHEDULES = ("cosine", "constant", "linear_warmup_cosine")
SHARDINGS = ("ddp", "fsdp", "hsdp")
PRECISIONS = ("fp32", "bf16")
DEVICES = ("auto", "cuda", "cpu")
CHECKPOINT_FORMATS = ("auto", "full", "sharded")
EVALUATION_SPLITS = ("test", "validation")  # what evaluation.enabled evaluates, as the step's evaluation does


class ConfigError(ValueError):
    """An invalid run configuration; the message names the field and the fix."""


def _doc(text: str, **kwargs: Any) -> Any:
    return field(metadata={"description": text}, **kwargs)


@dataclass(kw_only=True)
class ModelConfig:
    name: str = _doc(
        "Registered model ('mlp', 'cnn', 'transformer') or an import path 'pkg.module:factory' "
        "whose factory takes (input_shape, num_classes, **kwargs) and returns an nn.Module."
    )
    kwargs: dict[str, Any] = _doc("Keyword arguments passed to the model builder.", default_factory=dict)


@dataclass(kw_only=True)
class DataConfig:
    commit_id: str = _doc("Dataset-store commit the shards were read at (recorded for lineage).")
    manifest: dict[str, Any] = _doc("The shard manifest (format model-factory.shards/v1).")
    locations: dict[str, str] = _doc(
        "Where each manifest shard path lives: 'file:///abs/path' or 's3://bucket/key'."
    )
    s3_endpoint_url: str | None = _doc(
        "S3 endpoint for s3:// locations (None: AWS default). Credentials come only from AWS_* "
        "environment variables.",
        default=None,
    )
    cache_dir: str | None = _doc(
        "Local directory where s3:// shards are cached, keyed by sha256 (None: "
        "<checkpoint.dir>/../shard_cache).",
        default=None,
    )
    cache_limit: int | None = _doc(
        "Bytes of local disk the node's s3:// shard cache may use, split evenly between its ranks "
        "(each streams into <cache_dir>/rank-<local rank>). Shards are fetched as the ranks read them "
        "and deleted once read for the epoch, so this need not hold the dataset: one load's shards "
        "plus data.read_ahead more per rank is enough. None: 80% of the cache disk (its free space "
        "plus what is already cached there) at start. file:// shards are read in place and use none.",
        default=None,
    )
    read_ahead: int = _doc(
        "s3:// shards each rank fetches ahead of its reads, in the order it will read them, while "
        "data.cache_limit has room (0: fetch only when a batch needs a shard).",
        default=2,
    )
    partitions: int = _doc(
        "Canonical partitions P of each epoch's sample order (data.sample_order 'partitioned'): the order "
        "depends on the seed, the epoch and P, never on the world size, so a run may resume at any world "
        "size that divides P. 0: the world size of the run's first launch. A resumed run keeps its "
        "checkpoint's P. For runs that may resize, set a number with many divisors, e.g. 12.",
        default=0,
    )
    shuffle_block: int = _doc(
        "Shards whose samples are shuffled together (data.sample_order 'partitioned'): the epoch permutes "
        "the shards, then shuffles samples within each run of this many consecutive shards. Larger: more "
        "mixing; each rank then reads about this many shards at once per partition it holds.",
        default=4,
    )
    sample_order: str = _doc(
        "'partitioned': the order above. 'global': torch DistributedSampler's (a permutation of all "
        "samples strided by rank; it depends on the world size), the order of runs made before "
        "data.partitions existed, kept so that their versions reproduce.",
        default="partitioned",
    )


@dataclass(kw_only=True)
class AugmentConfig:
    padding: int = _doc("Image random crop: zero pixels added on every side before a window of the "
                        "stored size is cut at a seeded random place (0: no crop).", default=0)
    hflip: bool = _doc("Image augmentation: mirror half of the samples, chosen by (seed, epoch, sample).",
                       default=False)


@dataclass(kw_only=True)
class TrainConfig:
    epochs: int = _doc("Passes over the training split.", default=5)
    batch_size: int = _doc(
        "Global batch size per optimizer step, summed over all ranks and accumulation steps; "
        "must be divisible by world_size * grad_accum_steps.",
        default=64,
    )
    lr: float = _doc("Peak learning rate.", default=0.01)
    optimizer: str = _doc("'adamw' or 'sgd' (momentum 0.9).", default="adamw")
    weight_decay: float = _doc("Decoupled (AdamW) or L2 (SGD) weight decay.", default=0.0)
    lr_schedule: str = _doc("'cosine', 'constant' or 'linear_warmup_cosine'.", default="cosine")
    warmup_steps: int = _doc(
        "Linear warmup steps for 'linear_warmup_cosine' and 'constant' ('cosine' has none).", default=0)
    grad_accum_steps: int = _doc("Micro-batches accumulated per optimizer step on each rank.", default=1)
    seed: int = _doc("Seed for model init, shuffling and dropout.", default=0)
    max_steps: int | None = _doc("Stop after this many optimizer steps (None: run all epochs).", default=None)
    sharding: str = _doc(
        "'ddp' (replicated), 'fsdp' (FSDP2 fully_shard over all ranks) or 'hsdp' (sharded within a "
        "node, replicated across nodes: parameter all-gathers stay on the node's NVLink).", default="ddp")
    fsdp_units: str | None = _doc(
        "Module class names, comma-separated (e.g. 'GPT2Block'), whose instances FSDP shards as units of "
        "their own: each is all-gathered only around its own forward and backward. None: the platform's "
        "blocks for its own models, else modules of about fsdp_unit_params parameters "
        "(training_runtime/distributed/units.py).", default=None)
    fsdp_unit_params: int | None = _doc(
        "Size-based FSDP units (when fsdp_units is None and the model is not the platform's): at most this "
        "many parameters each (None: a sixteenth of the model's, at least 2**20).", default=None)
    activation_checkpointing: bool = _doc(
        "Recompute each FSDP unit's forward in the backward pass instead of keeping its activations "
        "(less memory, about one more forward of compute). FSDP/HSDP only, as are fsdp_units and "
        "fsdp_unit_params: under DDP they are refused.", default=False)
    precision: str = _doc(
        "'fp32' or 'bf16'. DDP: bf16 autocast. FSDP/HSDP: bf16 parameters in compute and fp32 gradient "
        "reductions (MixedPrecisionPolicy), fp32 master weights in the optimizer.", default="fp32")
    device: str = _doc(
        "'cuda' (required: a rank without a usable GPU fails with the reason), 'cpu' (gloo, never touches "
        "a GPU) or 'auto' (CUDA when torch sees one).", default="auto")
    tf32: bool = _doc("Let fp32 matmuls and convolutions use TF32 tensor cores on CUDA (about 8x the fp32 "
                      "rate on Ampere and later, 10-bit mantissa in the products).", default=True)
    deterministic: bool = _doc(
        "Deterministic kernels (torch.use_deterministic_algorithms, cuDNN without autotuning, "
        "CUBLAS_WORKSPACE_CONFIG): a resumed run reproduces an uninterrupted one bit for bit on the same "
        "hardware, software and world size, at some cost in speed.", default=False)
    grad_clip_norm: float | None = _doc(
        "Clip the global gradient norm to this value before each optimizer step (None: no clipping).", default=None)
    compile: bool = _doc("torch.compile the model (nn.Module.compile, so parameter names are unchanged).",
                         default=False)
    collective_timeout_s: float = _doc(
        "Process-group timeout for training collectives: a dead or hung peer fails the run after this "
        "long instead of blocking it forever.", default=600.0)
    io_timeout_s: float = _doc(
        "Timeout of the waits in which every rank waits on one rank's I/O (shard download and sha256 "
        "check, checkpoint verification on resume, synchronous checkpoint writes); they run on a "
        "separate gloo group so a large dataset or a slow volume does not trip collective_timeout_s.",
        default=3600.0)
    num_workers: int = _doc("Background loader threads gathering batches.", default=1)
    prefetch_batches: int = _doc("Batches prepared ahead of the training step.", default=4)
    augment: AugmentConfig = _doc("Seeded image augmentation of the training split.", default_factory=AugmentConfig)


@dataclass(kw_only=True)
class CheckpointConfig:
    dir: str = _doc("Absolute directory for checkpoints; must be shared by all ranks.")
    every_steps: int = _doc("Save every N optimizer steps (and always at the end).", default=50)
    keep_last: int = _doc("Number of newest checkpoints kept.", default=3)
    async_save: bool = _doc(
        "Copy state to host memory and write it in a background thread: buffers and the rest during the "
        "save, parameters and optimizer state beside the next forward and backward, the optimizer's next "
        "step waiting for that copy (without it, training waits until the checkpoint is published; its "
        "fsync runs in the background). Full format only.", default=False
    )
    format: str = _doc(
        "'full': rank 0 writes the whole model and optimizer state as one file (every rank reads it back "
        "whole on resume). 'sharded': every rank writes only its own FSDP shards with "
        "torch.distributed.checkpoint, and reads back only what it holds, also at another world size; needs "
        "train.sharding 'fsdp' or 'hsdp' and async_save off. 'auto': sharded under fsdp/hsdp without "
        "async_save, else full (a train_fn's ctx.save_checkpoint always writes full). Either format resumes "
        "from the other's checkpoints.", default="auto")

    def resolved_format(self, sharding: str) -> str:
        """'full' or 'sharded': what ``format`` means under ``sharding``."""
        if self.format != "auto":
            return self.format
        return "sharded" if sharding in ("fsdp", "hsdp") and not self.async_save else "full"


@dataclass(kw_only=True)
class ValidationConfig:
    every_steps: int | None = _doc(
        "Evaluate the validation split every N optimizer steps (None: at the end of every epoch).", default=None)
    metric: str | None = _doc(
        "Validation metric that early stopping and keep_best watch, e.g. 'loss', 'accuracy', 'perplexity' "
        "(None: the task's default).", default=None)
    mode: str | None = _doc("'min' or 'max' for metric (None: the task's default for its default metric).",
                            default=None)
    patience: int | None = _doc(
        "Stop after this many validations without improvement (None: no early stopping).", default=None)
    min_delta: float = _doc("An improvement must beat the best value by more than this.", default=0.0)
    keep_best: bool = _doc(
        "The model written out (and evaluated, registered) is the one of the best validation, not the last.",
        default=True)
    enabled: bool = _doc("Validate during training at all (needs a 'validation' split).", default=True)
    # A sweep's trials (ops/sweep.py): the orchestrator reads the validations as they happen and
    # may ask a trial to stop. Files on the checkpoint volume, so both launchers work the same way.
    report_file: str | None = _doc(
        "Rank 0 appends every validation's scalar metrics to this JSON-lines file (None: none).", default=None)
    stop_file: str | None = _doc(
        "When this file exists at a validation, training stops there as a pruned trial: outputs are written as "
        "after early stopping, and metrics.json says pruned (None: never).", default=None)


@dataclass(kw_only=True)
class EvaluationConfig:
    enabled: bool = _doc(
        "After training, rank 0 evaluates the model it wrote (model.safetensors, the keep_best weights) on "
        "the test and validation splits on its training device, in fp32, and writes evaluation.json beside "
        "it (recipe evaluate_on 'training'; off: the orchestrator's evaluation step computes the metrics).",
        default=False)
    batch_size: int = _doc("Samples per evaluation batch (the step's evaluation reads 512; the sums' order, so "
                           "the last digits of the figures, follow it).", default=512)


@dataclass(kw_only=True)
class TelemetryConfig:
    every_steps: int = _doc(
        "Record loss/lr history and report telemetry every N optimizer steps.", default=10
    )
    tensorboard: bool = _doc(
        "Rank 0 also writes the figures as TensorBoard event files in <checkpoint.dir>/../tensorboard.",
        default=True,
    )


@dataclass(frozen=True, kw_only=True)
class GuardsConfig:
    """What watches a training, the built-in trainer's and a train_fn's alike (train/guarding.py).
    The pipeline's ``guards`` setting is this class (core/spec.py), so one set of fields,
    defaults, descriptions and rules (``guard_problems``) serves the runtime, Python pipelines,
    YAML blocks and run config."""

    enabled: bool = _doc("Run the guards at all (off: no per-step non-finite check, no watchdog, no warnings; "
                         "for measuring what they cost).", default=True)
    hang_timeout_s: float | None = _doc(
        "Fail the attempt, printing every thread's stack, when no training step finishes for this long "
        "(validation, checkpoint and model writes excepted; null: no watchdog). A hang is retried: the attempt "
        "is restarted and resumes from the last checkpoint. Must stay below the collective timeout "
        "(recipe.collective_timeout_s), so the stacks are printed before the process group aborts.",
        default=300.0)
    nonfinite_skip_batches: int = _doc(
        "Non-finite loss or gradient: 0 stops the run at once, without a retry (a new attempt would repeat it), "
        "keeping the last good checkpoint; N > 0 skips up to N such batches (their optimizer step is not taken) "
        "before stopping. Skipping needs a host-device synchronisation every step, and only the built-in "
        "trainer can skip (a train function's reported non-finite loss always stops the run).", default=0)
    loss_spike_factor: float | None = _doc(
        "Warn when an interval's loss exceeds this multiple of the median of the recent intervals' (null: off).",
        default=3.0)
    loss_spike_window: int = _doc("Intervals in the loss spike's median.", default=10)
    straggler_factor: float = _doc(
        "Warn when a rank's compute time per step exceeds this multiple of the ranks' median.", default=1.5)
    straggler_window: int = _doc("Telemetry intervals the straggler check averages over.", default=5)
    straggler_min_excess_s: float = _doc(
        "...and exceeds the median by at least this many seconds per step (noise on tiny steps).", default=0.005)
    data_stall_share: float | None = _doc(
        "Warn when a rank waits for batches more than this share of its step time (null: off).", default=0.3)
    data_stall_min_wait_s: float = _doc(
        "...and more than this many seconds per step (noise on tiny steps).", default=0.005)
    gpu_max_temperature_c: float = _doc("Warn when a GPU reaches this temperature (NVML).", default=85.0)
    repeat_after_intervals: int = _doc(
        "A warning about the same detector and rank is repeated at most once per this many intervals.", default=10)


def guard_problems(guards: Any, *, collective_timeout_s: Any, collective_field: str = "train.collective_timeout_s",
                   train_fn: str | None = None) -> list[tuple[str, str]]:
    """(field, problem) for each guard setting that cannot work; empty when all can. Shared by
    ``RunConfig.validate`` and the pipeline's check when definitions load (core/spec.py), which
    names the collective timeout ``collective_field`` in its own terms."""
    problems: list[tuple[str, str]] = []
    for f in dataclasses.fields(GuardsConfig):
        value, kind = getattr(guards, f.name), str(f.type)
        if value is None and kind.endswith("| None"):
            continue
        base = kind.removesuffix(" | None")
        ok = (isinstance(value, bool) if base == "bool" else
              isinstance(value, int) and not isinstance(value, bool) if base == "int" else
              isinstance(value, (int, float)) and not isinstance(value, bool))
        if not ok:
            problems.append((f.name, f"must be {base}{' or null' if kind.endswith('| None') else ''}, got {value!r}"))
    if problems:
        return problems
    g = guards
    if g.nonfinite_skip_batches < 0:
        problems.append(("nonfinite_skip_batches", f"must be >= 0, got {g.nonfinite_skip_batches}"))
    elif g.nonfinite_skip_batches and train_fn is not None:
        problems.append(("nonfinite_skip_batches", f"skips batches inside the built-in trainer, but this run trains "
                         f"with train_fn {train_fn!r}, whose loop takes its own steps: set 0 (a reported "
                         "non-finite loss then stops the run), and skip bad batches in the function itself"))
    for name in ("loss_spike_window", "straggler_window", "repeat_after_intervals"):
        if getattr(g, name) < 1:
            problems.append((name, f"must be >= 1, got {getattr(g, name)}"))
    for name in ("loss_spike_factor", "straggler_factor"):
        value = getattr(g, name)
        if value is not None and not (value > 1.0 and math.isfinite(value)):
            problems.append((name, f"must be a finite number above 1, got {value}"))
    if g.data_stall_share is not None and not 0 < g.data_stall_share < 1:
        problems.append(("data_stall_share", f"must be between 0 and 1 (exclusive) or null, got {g.data_stall_share}"))
    for name in ("straggler_min_excess_s", "data_stall_min_wait_s"):
        if not getattr(g, name) >= 0:
            problems.append((name, f"must be >= 0, got {getattr(g, name)}"))
    if not math.isfinite(g.gpu_max_temperature_c) or g.gpu_max_temperature_c <= 0:
        problems.append(("gpu_max_temperature_c", f"must be a positive number of degrees, got {g.gpu_max_temperature_c}"))
    hang = g.hang_timeout_s
    if hang is not None and not (hang > 0 and math.isfinite(hang)):
        problems.append(("hang_timeout_s", f"must be a positive number of seconds or null, got {hang}"))
    elif hang is not None and isinstance(collective_timeout_s, (int, float)) and hang >= collective_timeout_s:
        problems.append(("hang_timeout_s", f"({hang:g}) must be below {collective_field} ({collective_timeout_s:g}): "
                         "the watchdog prints every rank's stack before the process group aborts the collective; "
                         f"lower it, raise {collective_field}, or set it to null (no watchdog)"))
    return problems


@dataclass(kw_only=True)
class RunConfig:
    model: ModelConfig = _doc("Which model to train.")
    data: DataConfig = _doc("The versioned shards to train on.")
    train: TrainConfig = _doc("Optimisation settings.", default_factory=TrainConfig)
    checkpoint: CheckpointConfig = _doc("Checkpointing settings.")
    output_dir: str = _doc("Absolute directory where rank 0 writes weights.pt, metrics.json, ...")
    telemetry: TelemetryConfig = _doc("Telemetry settings.", default_factory=TelemetryConfig)
    task: str = _doc("What the model learns: 'classification', 'regression', 'multilabel', "
                     "'language_modeling', or 'pkg.module:TaskClass'.", default="classification")
    train_fn: str | None = _doc(
        "'pkg.module:function' run on every rank with a TrainingContext instead of the built-in loop "
        "(None: the built-in trainer).", default=None)
    validation: ValidationConfig = _doc("Validation during training, early stopping and keep_best.",
                                        default_factory=ValidationConfig)
    guards: GuardsConfig = _doc("What stops or warns about a training going wrong (NaN, spikes, stragglers, "
                                "data stalls, hot GPUs, hangs).", default_factory=GuardsConfig)
    evaluation: EvaluationConfig = _doc("Evaluation of the written model by the training job itself.",
                                        default_factory=EvaluationConfig)
    launch: int = _doc(
        "Which launch of this training the config is for: 1 for the first, one more for each Dagster retry or "
        "re-execution (the orchestrator counts the launches recorded in <checkpoint.dir>/../attempts). Under "
        "torchrun every attempt leaves a record there (observe/attempts.py), named by launch and restart.",
        default=1)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        cfg = _build(cls, d, "")
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ---------------------------------------------------------------- validation
    def validate(self) -> None:
        validate_manifest(self.data.manifest, "data.manifest")
        self.model_build()  # the task fits the data and the model builds for it
        if self.train_fn is not None:
            _check_import_path("train_fn", self.train_fn, "function")
        self._validate_validation()
        self._validate_evaluation()
        _check_locations(self.data.manifest, self.data.locations, self.splits_read(), "data.locations")
        t = self.train
        for name in ("epochs", "batch_size", "grad_accum_steps", "num_workers", "prefetch_batches"):
            if getattr(t, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(t, name)}")
        if t.max_steps is not None and t.max_steps < 1:
            raise ConfigError(f"train.max_steps must be >= 1 or null, got {t.max_steps}")
        if t.warmup_steps < 0:
            raise ConfigError(f"train.warmup_steps must be >= 0, got {t.warmup_steps}")
        if t.warmup_steps and t.lr_schedule == "cosine":
            raise ConfigError("train.warmup_steps is not used by train.lr_schedule 'cosine'; use "
                              "'linear_warmup_cosine' or set warmup_steps to 0")
        if not (t.lr > 0 and math.isfinite(t.lr)):
            raise ConfigError(f"train.lr must be a positive finite number, got {t.lr}")
        if t.weight_decay < 0:
            raise ConfigError(f"train.weight_decay must be >= 0, got {t.weight_decay}")
        _check_choice("train.optimizer", t.optimizer, OPTIMIZERS)
        _check_choice("train.lr_schedule", t.lr_schedule, LR_SCHEDULES)
        _check_choice("train.sharding", t.sharding, SHARDINGS)
        _check_choice("train.precision", t.precision, PRECISIONS)
        _check_choice("train.device", t.device, DEVICES)
        if t.fsdp_unit_params is not None and t.fsdp_unit_params < 1:
            raise ConfigError(f"train.fsdp_unit_params must be a positive number of parameters or null, got "
                              f"{t.fsdp_unit_params}")
        for name, problem in fsdp_problems(sharding=t.sharding, fsdp_units=t.fsdp_units,
                                           fsdp_unit_params=t.fsdp_unit_params,
                                           activation_checkpointing=t.activation_checkpointing):
            raise ConfigError(f"train.{name} {problem}")
        if t.grad_clip_norm is not None and not (t.grad_clip_norm > 0 and math.isfinite(t.grad_clip_norm)):
            raise ConfigError(f"train.grad_clip_norm must be a positive finite number or null, got {t.grad_clip_norm}")
        for name in ("collective_timeout_s", "io_timeout_s"):
            value = getattr(t, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"train.{name} must be a positive number of seconds, got {value}")
        c = self.checkpoint
        if not os.path.isabs(c.dir):
            raise ConfigError(f"checkpoint.dir must be an absolute path, got {c.dir!r}")
        if c.every_steps < 1:
            raise ConfigError(f"checkpoint.every_steps must be >= 1, got {c.every_steps}")
        if c.keep_last < 1:
            raise ConfigError(f"checkpoint.keep_last must be >= 1, got {c.keep_last}")
        _check_choice("checkpoint.format", c.format, CHECKPOINT_FORMATS)
        if c.format == "sharded" and t.sharding not in ("fsdp", "hsdp"):
            raise ConfigError(f"checkpoint.format 'sharded' saves FSDP shards, but train.sharding is {t.sharding!r} "
                              "(every rank holds everything); set checkpoint.format 'full' or 'auto', or "
                              "train.sharding 'fsdp'")
        if c.format == "sharded" and self.train_fn is not None:
            raise ConfigError("checkpoint.format 'sharded' is the built-in trainer's; a train_fn saves what it hands "
                              "ctx.save_checkpoint as a full checkpoint: set checkpoint.format 'auto' or 'full'")
        if c.format == "sharded" and c.async_save:
            raise ConfigError("checkpoint.format 'sharded' writes every rank's shards in step with the others and "
                              "cannot be combined with checkpoint.async_save; set async_save false, or "
                              "checkpoint.format 'full' (or 'auto') to keep background writes")
        if not os.path.isabs(self.output_dir):
            raise ConfigError(f"output_dir must be an absolute path, got {self.output_dir!r}")
        if self.data.cache_dir is not None and not os.path.isabs(self.data.cache_dir):
            raise ConfigError(f"data.cache_dir must be an absolute path, got {self.data.cache_dir!r}")
        if self.data.cache_limit is not None and (not isinstance(self.data.cache_limit, int) or self.data.cache_limit < 1):
            raise ConfigError(f"data.cache_limit must be a positive number of bytes or null, got {self.data.cache_limit!r}")
        if not isinstance(self.data.read_ahead, int) or self.data.read_ahead < 0:
            raise ConfigError(f"data.read_ahead must be a number of shards >= 0, got {self.data.read_ahead!r}")
        self._validate_sample_order()
        if self.launch < 1:
            raise ConfigError(f"launch must be >= 1, got {self.launch}")
        if self.telemetry.every_steps < 1:
            raise ConfigError(f"telemetry.every_steps must be >= 1, got {self.telemetry.every_steps}")
        self._validate_guards()
        a = self.train.augment
        if a.padding < 0:
            raise ConfigError(f"train.augment.padding must be >= 0, got {a.padding}")
        if (a.padding or a.hflip) and self.data_info().kind != "images":
            raise ConfigError(f"train.augment applies to images; this data is {self.data_info().kind!r}: "
                              "set padding 0 and hflip false")

    def _validate_guards(self) -> None:
        problems = guard_problems(self.guards, collective_timeout_s=self.train.collective_timeout_s,
                                  train_fn=self.train_fn)
        if problems:
            name, problem = problems[0]
            raise ConfigError(f"guards.{name} {problem}")

    def _validate_validation(self) -> None:
        v = self.validation
        if v.every_steps is not None and v.every_steps < 1:
            raise ConfigError(f"validation.every_steps must be >= 1 or null, got {v.every_steps}")
        if v.patience is not None and v.patience < 1:
            raise ConfigError(f"validation.patience must be >= 1 or null, got {v.patience}")
        if v.mode is not None and v.mode not in ("min", "max"):
            raise ConfigError(f"validation.mode must be 'min', 'max' or null, got {v.mode!r}")
        if v.min_delta < 0:
            raise ConfigError(f"validation.min_delta must be >= 0, got {v.min_delta}")
        if not v.enabled:
            if v.patience is not None:
                raise ConfigError("validation.patience needs validation.enabled: early stopping watches validation")
            return
        if "validation" not in self.data.manifest["splits"]:
            raise ConfigError("validation.enabled needs a 'validation' split in data.manifest; set "
                              "validation.enabled to false or re-shard with a validation fraction")
        metric, _ = self.monitor()
        names = self.task_object().metric_names
        if metric not in names:
            raise ConfigError(f"validation.metric {metric!r} is not a metric of task {self.task!r}; it has "
                              f"{list(names)}")

    def _validate_evaluation(self) -> None:
        e = self.evaluation
        if not e.enabled:
            return
        if e.batch_size < 1:
            raise ConfigError(f"evaluation.batch_size must be >= 1, got {e.batch_size}")
        missing = [s for s in EVALUATION_SPLITS if s not in self.data.manifest["splits"]]
        if missing:
            raise ConfigError(f"evaluation.enabled needs the splits {list(EVALUATION_SPLITS)} in data.manifest; it "
                              f"lacks {missing}: re-shard with test and validation fractions or set "
                              "evaluation.enabled to false (recipe evaluate_on 'step')")
        _check_locations(self.data.manifest, self.data.locations, list(EVALUATION_SPLITS), "data.locations")

    # ---------------------------------------------------------------- derived
    def splits_read(self) -> list[str]:
        """Manifest splits the training run reads."""
        return ["train", "validation"] if self.validation.enabled else ["train"]

    def data_info(self):
        from training_runtime.data.info import DataInfo, DataInfoError

        try:
            return DataInfo.from_manifest(self.data.manifest)
        except (DataInfoError, KeyError) as e:
            raise ConfigError(f"data.manifest cannot be trained on: {e}") from e

    def task_object(self):
        from training_runtime.tasks.registry import resolve_task

        try:
            return resolve_task(self.task, self.data_info())
        except ValueError as e:
            raise ConfigError(str(e)) from e

    def monitor(self) -> tuple[str, str]:
        """(validation metric, 'min' or 'max') that early stopping and keep_best watch."""
        task = self.task_object()
        metric = self.validation.metric or task.monitor[0]
        if self.validation.mode is not None:
            return metric, self.validation.mode
        if metric == task.monitor[0]:
            return metric, task.monitor[1]
        from training_runtime.tasks.names import LOWER_IS_BETTER

        return metric, "min" if metric in LOWER_IS_BETTER else "max"

    def model_build(self):
        """The ModelBuild (factory, input shape, outputs, data kwargs) for this run's data and task."""
        from training_runtime.models.build import check_builds, model_build

        m = self.model
        _check_model_name(m.name)
        if not isinstance(m.kwargs, dict):
            raise ConfigError("model.kwargs must be an object of keyword arguments")
        task = self.task_object()
        build = model_build(m.name, m.kwargs, self.data_info(), task.num_outputs())
        try:
            check_builds(build)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"model {m.name!r} cannot be built with model.kwargs {m.kwargs} for input shape "
                              f"{build.input_shape} and {build.num_outputs} outputs (task {task.name!r}): {e}") from e
        return build

    def _validate_sample_order(self) -> None:
        d = self.data
        _check_choice("data.sample_order", d.sample_order, SAMPLE_ORDERS)
        n = d.manifest["splits"]["train"]["num_samples"]
        if not 0 <= d.partitions <= n:
            raise ConfigError(f"data.partitions must be between 0 (the first launch's world size) and the {n} "
                              f"training samples, got {d.partitions}")
        if d.shuffle_block < 1:
            raise ConfigError(f"data.shuffle_block must be >= 1 shard, got {d.shuffle_block}")

    def validate_world_size(self, world_size: int) -> None:
        """Fail before training when the run cannot be split over ``world_size`` ranks."""
        t = self.train
        per_step = world_size * t.grad_accum_steps
        if t.batch_size % per_step:
            raise ConfigError(
                f"train.batch_size={t.batch_size} is not divisible by world_size ({world_size}) x "
                f"train.grad_accum_steps ({t.grad_accum_steps}) = {per_step}; choose a multiple of "
                f"{per_step} or change the number of ranks"
            )
        if self.data.sample_order == "partitioned" and self.data.partitions:
            check_partitions(self.data.partitions, world_size, "data.partitions")
        n = self.data.manifest["splits"]["train"]["num_samples"]
        if world_size > n:
            raise ConfigError(
                f"world_size {world_size} exceeds the {n} training samples in data.manifest; "
                "use fewer ranks (--nproc-per-node / nodes)"
            )

    def cache_dir(self) -> str:
        if self.data.cache_dir is not None:
            return self.data.cache_dir
        return os.path.join(os.path.dirname(os.path.normpath(self.checkpoint.dir)), "shard_cache")


# -------------------------------------------------------------------- helpers
def check_partitions(partitions: int, world_size: int, source: str) -> None:
    """A world size must divide the run's canonical partitions: each rank then holds whole ones.
    ``source`` says where P comes from (the setting, or the checkpoint that fixed it)."""
    if partitions % world_size:
        fits = [w for w in range(1, partitions + 1) if partitions % w == 0]
        raise ConfigError(
            f"world size {world_size} does not divide {source}={partitions}, the canonical partitions of this "
            f"run's sample order: run it on {fits} ranks. For a run that must change size, set "
            "data.partitions to a number with many divisors (e.g. data.partitions=12) at its first launch")


def fsdp_problems(*, sharding: str, fsdp_units: Any, fsdp_unit_params: Any, activation_checkpointing: Any,
                  section: str = "train") -> list[tuple[str, str]]:
    """(field, problem) for FSDP settings that cannot apply; empty when all can. Shared by
    ``RunConfig.validate`` and the pipeline's check when definitions load or an override is
    applied (core/spec.py, ``section`` 'recipe'), so a user reads it before any worker starts.
    DDP replicates the whole model and has no units: units, unit sizes or recomputation per unit
    accepted there would let a user believe the model is sharded or recomputed when it is not.
    Unit names must be class names; whether the model has such classes is known once it is
    built (``distributed.units.fsdp_units``, which names the classes it does have)."""
    problems: list[tuple[str, str]] = []
    if sharding not in ("fsdp", "hsdp"):
        fix = (f"set {section}.sharding to 'fsdp' (a pipeline's recipe={{'sharding': 'fsdp'}}, one run's "
               f"--set train.sharding=fsdp) or remove {section}.")
        given = {"fsdp_units": (fsdp_units, None), "fsdp_unit_params": (fsdp_unit_params, None),
                 "activation_checkpointing": (activation_checkpointing, False)}
        for name, (value, unset) in given.items():
            if value != unset:
                problems.append((name, f"is {value!r}, but {section}.sharding is {sharding!r}: it applies to FSDP "
                                       f"units, and DDP replicates the whole model on every rank and has none; "
                                       f"{fix}{name}"))
    if fsdp_units is not None:
        names = [n.strip() for n in str(fsdp_units).split(",") if n.strip()]  # as units.parse_unit_names reads it
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", n)]
        if not isinstance(fsdp_units, str) or not names or bad:
            problems.append(("fsdp_units", f"{fsdp_units!r} must be module class names, comma-separated (e.g. "
                                           "'GPT2Block' or 'my_team.model.Block'), or None for the default units"
                                           + (f"; {bad} are not class names" if bad else "")))
    return problems


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}")


def _check_model_name(name: str) -> None:
    from training_runtime.models.names import BUILTIN_MODELS

    if name in BUILTIN_MODELS:
        return
    if ":" not in name:
        raise ConfigError(
            f"model.name {name!r} is unknown; use one of {list(BUILTIN_MODELS)} or an import path "
            "'pkg.module:factory'"
        )
    _check_import_path("model.name", name, "factory")


def _check_import_path(field_name: str, path: str, what: str) -> None:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ConfigError(f"{field_name} {path!r} must look like 'package.module:{what}'")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{field_name} {path!r}: cannot import module {module!r} ({e}); "
                          "check the import path and that the package is installed") from e
    if not callable(getattr(mod, attr, None)):
        raise ConfigError(f"{field_name} {path!r}: module {module!r} has no callable {attr!r}")


def validate_manifest(man: Any, where: str = "manifest") -> None:
    """Check the manifest's shape and internal consistency (sizes, counts, dtypes); v1 (float32
    features, int64 labels) or v2 (typed columns)."""
    if not isinstance(man, dict):
        raise ConfigError(f"{where} must be an object, got {type(man).__name__}")
    if man.get("format") == SHARD_FORMAT_V2:
        _validate_v2_manifest(man, where)
        return
    if man.get("format") != SHARD_FORMAT:
        raise ConfigError(f"{where}.format must be {SHARD_FORMAT!r} or {SHARD_FORMAT_V2!r}, got {man.get('format')!r}")
    fs = man.get("feature_shape")
    if not (isinstance(fs, list) and fs and all(isinstance(x, int) and x > 0 for x in fs)):
        raise ConfigError(f"{where}.feature_shape must be a non-empty list of positive ints, got {fs!r}")
    if man.get("feature_dtype") != "float32":
        raise ConfigError(f"{where}.feature_dtype must be 'float32', got {man.get('feature_dtype')!r}")
    if man.get("label_dtype") != "int64":
        raise ConfigError(f"{where}.label_dtype must be 'int64', got {man.get('label_dtype')!r}")
    nc = man.get("num_classes")
    if not (isinstance(nc, int) and nc >= 2):
        raise ConfigError(f"{where}.num_classes must be an int >= 2, got {nc!r}")
    names = man.get("class_names")
    if names is not None and (not isinstance(names, list) or len(names) != nc):
        raise ConfigError(f"{where}.class_names must list num_classes ({nc}) names")
    splits = man.get("splits")
    if not isinstance(splits, dict) or "train" not in splits:
        raise ConfigError(f"{where}.splits must be an object with at least a 'train' split")
    sample_bytes = math.prod(fs) * 4 + 8
    for split, spec in splits.items():
        sw = f"{where}.splits.{split}"
        shards = spec.get("shards") if isinstance(spec, dict) else None
        if not isinstance(shards, list) or not shards:
            raise ConfigError(f"{sw}.shards must be a non-empty list")
        total = 0
        for i, s in enumerate(shards):
            for key in ("path", "num_samples", "sha256", "num_bytes"):
                if key not in s:
                    raise ConfigError(f"{sw}.shards[{i}] lacks {key!r}")
            if not (isinstance(s["num_samples"], int) and s["num_samples"] > 0):
                raise ConfigError(f"{sw}.shards[{i}].num_samples must be a positive int")
            if s["num_bytes"] != s["num_samples"] * sample_bytes:
                raise ConfigError(
                    f"{sw}.shards[{i}].num_bytes is {s['num_bytes']} but {s['num_samples']} samples of "
                    f"feature_shape {fs} float32 + int64 label take {s['num_samples'] * sample_bytes}"
                )
            total += s["num_samples"]
        if spec.get("num_samples") != total:
            raise ConfigError(f"{sw}.num_samples is {spec.get('num_samples')} but its shards hold {total}")


def _validate_v2_manifest(man: dict, where: str) -> None:
    from training_runtime.data.shard_format import ShardFormatError, columns_from_manifest

    try:
        columns = columns_from_manifest(man)
    except (ShardFormatError, KeyError, TypeError) as e:
        raise ConfigError(f"{where}.columns are invalid: {e}") from e
    names = [c.name for c in columns]
    splits = man.get("splits")
    if not isinstance(splits, dict) or "train" not in splits:
        raise ConfigError(f"{where}.splits must be an object with at least a 'train' split")
    for split, spec in splits.items():
        sw = f"{where}.splits.{split}"
        shards = spec.get("shards") if isinstance(spec, dict) else None
        if not isinstance(shards, list) or not shards:
            raise ConfigError(f"{sw}.shards must be a non-empty list")
        total = 0
        for i, s in enumerate(shards):
            for key in ("path", "num_samples", "sha256", "num_bytes", "columns"):
                if key not in s:
                    raise ConfigError(f"{sw}.shards[{i}] lacks {key!r}")
            if not (isinstance(s["num_samples"], int) and s["num_samples"] > 0):
                raise ConfigError(f"{sw}.shards[{i}].num_samples must be a positive int")
            missing = [n for n in names if n not in s["columns"]]
            if missing:
                raise ConfigError(f"{sw}.shards[{i}].columns lacks the block of column(s) {missing}")
            for c in columns:
                block = s["columns"][c.name]
                if block["offset"] + block["num_bytes"] > s["num_bytes"]:
                    raise ConfigError(f"{sw}.shards[{i}] column {c.name!r} runs past the shard's {s['num_bytes']} bytes")
                if c.kind == "ndarray" and block["num_bytes"] != s["num_samples"] * c.sample_bytes:
                    raise ConfigError(f"{sw}.shards[{i}] column {c.name!r} holds {block['num_bytes']} bytes, "
                                      f"{s['num_samples']} samples of {c.dtype}{list(c.shape)} take "
                                      f"{s['num_samples'] * c.sample_bytes}")
            total += s["num_samples"]
        if spec.get("num_samples") != total:
            raise ConfigError(f"{sw}.num_samples is {spec.get('num_samples')} but its shards hold {total}")


def _check_locations(man: dict, locations: Any, splits: list[str], where: str) -> None:
    if not isinstance(locations, dict):
        raise ConfigError(f"{where} must map shard paths to URLs")
    for split in splits:
        if split not in man["splits"]:
            raise ConfigError(f"manifest has no split {split!r}; it has {sorted(man['splits'])}")
        for s in man["splits"][split]["shards"]:
            url = locations.get(s["path"])
            if url is None:
                raise ConfigError(f"{where} has no location for shard {s['path']!r} (split {split!r})")
            if not (url.startswith("file:///") or url.startswith("s3://")):
                raise ConfigError(f"{where}[{s['path']!r}] must be 'file:///abs/path' or 's3://bucket/key', got {url!r}")


def _build(cls: type, d: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "config"
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be an object, got {type(d).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key '{prefix}{unknown[0]}' in {where}; allowed keys: {sorted(fields)}")
    kwargs = {}
    for name, f in fields.items():
        path = f"{prefix}{name}"
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"missing required key {path!r}")
            continue
        kwargs[name] = _coerce(f.type, d[name], path)
    return cls(**kwargs)


_NESTED = {"ModelConfig": ModelConfig, "DataConfig": DataConfig, "TrainConfig": TrainConfig,
           "CheckpointConfig": CheckpointConfig, "TelemetryConfig": TelemetryConfig,
           "AugmentConfig": AugmentConfig, "ValidationConfig": ValidationConfig, "GuardsConfig": GuardsConfig,
           "EvaluationConfig": EvaluationConfig}


def _coerce(type_str: str, value: Any, path: str) -> Any:
    t = str(type_str)
    if t in _NESTED:
        return _build(_NESTED[t], value, path + ".")
    optional = t.endswith("| None")
    base = t.removesuffix(" | None")
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{path} must not be null")
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "dict[str, Any]": isinstance(value, dict),
        "dict[str, str]": isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()),
    }[base]
    if not ok:
        raise ConfigError(f"{path} must be {base}, got {type(value).__name__} {value!r}")
    return float(value) if base == "float" else value
