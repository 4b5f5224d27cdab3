"""Pipelines declared in YAML: one folder per pipeline holding a defs.yaml (see pipelines/components)."""
