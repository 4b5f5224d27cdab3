"""Names of the built-in models, without importing torch.

Pipeline definitions check a model name when they load, and they load in every Dagster process
(webserver, daemon, code server, each run worker); importing ``training_runtime.models`` there
would import torch, which takes 3-4 s here. ``models.REGISTRY`` is checked against this list.
"""

BUILTIN_MODELS = ("cnn", "mlp", "resnet", "text_transformer", "transformer", "transformer_lm")
