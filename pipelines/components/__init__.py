"""Pipelines declared in YAML: building blocks as Dagster components.

A team composes its pipelines from blocks, one ``defs.yaml`` per folder under a defs module
(``pipelines/defs/`` for the platform's code location):

- ``pipelines.components.DatasetBlock``: a dataset alone (raw_dataset -> shards);
- ``pipelines.components.TrainingBlock``: a model trained on a dataset block of this location, or
  (``dataset_location``) on a dataset another team's code location publishes;
- ``pipelines.components.ModelPipelineComponent``: a whole pipeline at once.

``pipelines/defs/<name>/defs.yaml``::

    type: pipelines.components.ModelPipelineComponent
    attributes:
      name: digits_cnn
      dataset: digits          # train on the digits pipeline's shards
      model_name: cnn
      recipe: {epochs: 3, batch_size: 32}
      gate: {min_test_accuracy: 0.5}

Each block becomes the same PipelineSpec ``dataset_pipeline(...)``/``model_pipeline(...)`` builds
in Python and goes through the same validation; its errors name the YAML file, line and field.
``scaffold_block`` (pipelines/components/scaffold.py) writes a new block from its template.
"""

from pipelines.components.blocks import Block, DatasetBlock, ModelPipelineComponent, TrainingBlock
from pipelines.components.composition import DEFS_MODULE, REPO_ROOT, load_component_tree, yaml_pipelines
from pipelines.components.located import BlockDefinitionError

__all__ = ["DEFS_MODULE", "REPO_ROOT", "Block", "BlockDefinitionError", "DatasetBlock", "ModelPipelineComponent",
           "TrainingBlock", "load_component_tree", "yaml_pipelines"]
