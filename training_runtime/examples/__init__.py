"""User code as the training pods import it: plain PyTorch beside the runtime, no Dagster (the
pipeline that names it, by import path, lives in pipelines/models/). A team's own code of this
kind ships in its package, installed in the training image next to training_runtime."""
