"""The model pipelines written in Python. Add a module here and list it in PIPELINES; pipelines
declared in YAML live under pipelines/defs/ (see pipelines/components)."""

from pipelines.models.digits import digits_pipeline
from pipelines.models.pydoc_corpus import pydoc_corpus
from pipelines.models.shapes import shapes_dataset
from pipelines.models.wine import wine_pipeline

# digits and wine train models; shapes (an image folder) and pydoc (a text corpus) are datasets,
# versioned and published for training code that reads typed shards.
PIPELINES = [digits_pipeline, wine_pipeline, shapes_dataset, pydoc_corpus]
