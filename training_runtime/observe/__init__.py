"""Watching a training: telemetry, guards (non-finite values, hangs, stragglers, stalls, GPU health),
GPU statistics, TensorBoard, Dagster Pipes, error files, and the facts each rank reports for lineage."""
