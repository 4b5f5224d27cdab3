"""The model pipelines written in Python. Add a module here and list it in PIPELINES; pipelines
declared in YAML live under pipelines/defs/ (see pipelines/components)."""

from pipelines.models.denoising import digits_denoiser
from pipelines.models.diabetes import diabetes_dataset, diabetes_mlp
from pipelines.models.digits import digits_pipeline
from pipelines.models.pydoc_corpus import pydoc_corpus, pydoc_lm
from pipelines.models.shapes import shapes_dataset, shapes_resnet
from pipelines.models.wine import wine_pipeline

# Tables: digits and wine (classification), diabetes (regression); an image folder (shapes) and a
# text corpus (pydoc) with a ResNet and a language model; and a denoising autoencoder trained by
# its own training loop on the digits' shards.
PIPELINES = [digits_pipeline, wine_pipeline, diabetes_dataset, diabetes_mlp, shapes_dataset, shapes_resnet,
             pydoc_corpus, pydoc_lm, digits_denoiser]
