"""The platform's Dagster-free core: the pipeline spec, standard expectation suites, the model
registry, registration, lineage, code version and the pinned-shards read.

Every layer above (ops, assets, pipelines) uses it; it imports only the resources' store
interface and training_runtime's torch-free model names, so it is tested and reused alone.
"""
