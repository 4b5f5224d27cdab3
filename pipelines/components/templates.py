"""The defs.yaml a new block starts from, one per kind: every field, commented.

Lines marked REQUIRED hold an empty value that does not load: left as written, loading the block
fails at that line. Optional fields are commented out with their defaults; the defaults of recipe,
guards, gate, triggers and split are read from core.spec, so the templates cannot drift from them.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from string import Template

from core.spec import Guards, QualityGate, Recipe, Split, Triggers

_HEADER = """\
# $what "$name", scaffolded from the $kind template (pipelines/components/templates.py).
# Fill in the lines marked REQUIRED; every other field is optional and shown commented out with
# its default. Mistakes are reported as <this file>:<line>: field '<field>': <problem>.
"""

_DATASET = _HEADER + """\
type: pipelines.components.DatasetBlock
attributes:
  name: $name
  # description: One line for the UI.
  # Where the rows come from: CSV/Parquet paths or globs under the store's sources/ area (the
  # new-data sensor watches them), or instead a loader, 'package.module:function' returning a DataFrame.
  source: []  # REQUIRED (or loader), e.g. [my_dataset/*.csv]
  # loader: my_package.my_module:load_frame
  features: []  # REQUIRED: the feature columns, in the order models read them, e.g. [x1, x2]
  # task: classification  # or regression (label: a numeric column) or multilabel (labels)
  label:  # REQUIRED (classification, regression): the label column, or the numeric target column
  classes: []  # REQUIRED for classification: at least two class names, e.g. [cat, dog] or [0, 1]
  # labels: []  # multilabel: the 0/1 column of each label, e.g. [urgent, billing]
  # target_range: null  # regression: [low, high] every target must lie in
  # id_column: null  # a unique id per row; the train/validation/test split is keyed on it
  # feature_shape: null  # shape of one sample's features, e.g. [8, 8]; default: [number of features]
  # expectations: my_package.my_module:suite  # a QualitySuite; default: QualitySuite.standard()
  # split:  # how samples are split and cut into shard files
$split
  # triggers:  # when this dataset's job (ingest, shard, train the blocks naming it) runs
$triggers
  # team: ml  # for the queue's per-team limit
"""

_TRAINING = _HEADER + """\
type: pipelines.components.TrainingBlock
attributes:
  name: $name
  # description: One line for the UI.
  dataset:  # REQUIRED: a dataset block (or pipeline) of this code location, or with dataset_location another's
  # dataset_location: null  # the code location that publishes the dataset, when it is another team's
  # dataset_version: null  # with dataset_location: pin '<dataset>-d<N>'; default: the newest published
  model_name:  # REQUIRED: mlp, cnn, resnet, transformer, transformer_lm, text_transformer, or 'package.module:factory'
  # model_kwargs: {}  # model constructor arguments, e.g. {hidden_sizes: [128, 64]}
  # task: classification  # the dataset's task; or 'package.module:TaskClass' (your loss, metrics, predictions)
  # train: null  # 'package.module:function' run on every rank with a TrainingContext instead of the built-in loop
  # recipe:  # how to train; GPUs: gpus_per_node, nnodes, gpu_resource_name (or a MIG profile)
$recipe
  # guards:  # what watches the training (training_runtime/config.py GuardsConfig): a hang (no step for
  #          # hang_timeout_s, below recipe.collective_timeout_s) is retried; a non-finite loss stops the run
$guards
  # placement:  # where training pods run on Kubernetes (core/placement.py)
  #   node_selector: {}  # e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
  #   tolerations: []  # e.g. [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  #   affinity: null  # a pod affinity, as in a pod spec
  #   priority_class: null  # default: the chart's training class for scheduled/new-data runs, ad-hoc otherwise
  #   cpu: null  # fixed pod sizes instead of the recipe's per-GPU ones (CPU-only pods), e.g. '4', '16Gi', '2Gi'
  #   memory: null
  #   shm: null
  # sweep:  # every training becomes an Optuna search; the best trial is registered (core/sweep.py)
  #   space: {train.lr: {low: 0.0001, high: 0.1, log: true}, model.hidden_sizes: [[64], [128]]}
  #   objective: loss  # a validation metric of the task
  #   trials: 8
  #   parallelism: 2  # trials at a time (each holds its GPUs)
  #   pruner: median  # median, successive_halving or none; sampler: tpe, random or grid
  # gate:  # a model version reaches main only when it meets these; any metric as <split>_<metric>: {min/max}
  #   test_accuracy: {min: 0.9}
$gate
  # triggers:  # when it retrains on its own (the dataset's job trains it too)
$triggers
  # team: ml  # for the queue's per-team limit
"""

_PIPELINE = _HEADER + """\
type: pipelines.components.ModelPipelineComponent
attributes:
  name: $name
  # description: One line for the UI.
  # Its own data (source or loader, features, label, classes), or another pipeline's (dataset).
  source: []  # REQUIRED (or loader, or dataset), e.g. [my_dataset/*.csv]
  # loader: my_package.my_module:load_frame  # a function returning a DataFrame
  # dataset: null  # train on this pipeline's shards instead (then leave out source, features, label, classes)
  features: []  # REQUIRED unless dataset: the feature columns, e.g. [x1, x2]
  label:  # REQUIRED unless dataset: the label column
  classes: []  # REQUIRED unless dataset: at least two class names, e.g. [cat, dog]
  # labels: []  # task multilabel: the 0/1 column of each label
  # target_range: null  # task regression: [low, high] of the targets
  # id_column: null  # a unique id per row; the split is keyed on it
  # expectations: my_package.my_module:suite  # a QualitySuite; default: QualitySuite.standard()
  # model_name: mlp  # mlp, cnn, transformer, or 'package.module:factory'
  # model_kwargs: {}  # model constructor arguments
  # task: classification  # or regression (label: a numeric column) or multilabel
  # train: null  # 'package.module:function': your own training loop, run on every rank
  # recipe:  # how to train; GPUs: gpus_per_node, nnodes, gpu_resource_name (or a MIG profile)
$recipe
  # guards:  # what watches the training: hang_timeout_s, nonfinite_skip_batches, ... (GuardsConfig)
$guards
  # placement:  # where training pods run on Kubernetes: node_selector, tolerations, affinity,
  #             # priority_class, cpu, memory, shm (core/placement.py)
  # sweep:  # an Optuna search at every training (core/sweep.py): space, objective, trials, parallelism
  # gate:
$gate
  # split:
$split
  # triggers:
$triggers
  # team: ml  # for the queue's per-team limit
"""

# kind -> (component type, what the header calls it, template)
TEMPLATES = {
    "dataset": ("pipelines.components.DatasetBlock", "Dataset block", _DATASET),
    "training": ("pipelines.components.TrainingBlock", "Training block", _TRAINING),
    "pipeline": ("pipelines.components.ModelPipelineComponent", "Whole pipeline", _PIPELINE),
}


def _defaults(cls: type) -> str:
    """``cls``'s fields as commented-out YAML lines under a section key, with their defaults."""
    lines = []
    for f in fields(cls):
        default = f.default if f.default is not MISSING else f.default_factory()
        lines.append(f"  #   {f.name}: {json.dumps(default)}")  # JSON scalars are YAML scalars
    return "\n".join(lines)


def render(kind: str, name: str) -> str:
    """The defs.yaml text of a new ``kind`` block named ``name``."""
    _, what, template = TEMPLATES[kind]
    return Template(template).substitute(
        name=name, kind=kind, what=what, recipe=_defaults(Recipe), guards=_defaults(Guards), gate=_defaults(QualityGate),
        triggers=_defaults(Triggers), split=_defaults(Split))
