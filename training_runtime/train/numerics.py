"""Process-wide numeric settings of a training: TF32 tensor cores, deterministic kernels, cuDNN
autotuning. They are set once, before the first CUDA kernel, from the run's ``train`` settings."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# cuBLAS picks reduction splits per stream; with a fixed workspace per handle its results are
# reproducible (NVIDIA's documented requirement for deterministic cuBLAS since CUDA 10.2).
CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"


@dataclass(frozen=True)
class NumericSettings:
    float32_matmul_precision: str  # "high": TF32 tensor cores; "highest": true fp32
    cudnn_allow_tf32: bool
    cudnn_benchmark: bool
    deterministic: bool
    cublas_workspace_config: str | None


def numeric_settings(*, tf32: bool, deterministic: bool, environ_cublas: str | None) -> NumericSettings:
    """What to set for a run's ``train.tf32`` and ``train.deterministic``. cuDNN autotuning picks
    the fastest convolution per shape, which may differ between processes, so it is on only when
    determinism is not asked for. A CUBLAS_WORKSPACE_CONFIG already set by the user is kept."""
    return NumericSettings(
        float32_matmul_precision="high" if tf32 else "highest",
        cudnn_allow_tf32=tf32,
        cudnn_benchmark=not deterministic,
        deterministic=deterministic,
        cublas_workspace_config=(environ_cublas or CUBLAS_DETERMINISTIC_WORKSPACE) if deterministic else None,
    )


def apply_numeric_settings(s: NumericSettings) -> None:
    """Set them in this process (before CUDA creates its cuBLAS handles)."""
    if s.cublas_workspace_config is not None:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = s.cublas_workspace_config
    torch.set_float32_matmul_precision(s.float32_matmul_precision)
    torch.backends.cudnn.allow_tf32 = s.cudnn_allow_tf32
    torch.backends.cudnn.benchmark = s.cudnn_benchmark
    torch.backends.cudnn.deterministic = s.deterministic
    # Ops without a deterministic implementation raise instead of silently breaking the promise.
    torch.use_deterministic_algorithms(s.deterministic)


def configure_numerics(train) -> NumericSettings:
    """Apply ``train.tf32`` / ``train.deterministic`` (a TrainConfig) to this process."""
    settings = numeric_settings(tf32=train.tf32, deterministic=train.deterministic,
                                environ_cublas=os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    apply_numeric_settings(settings)
    return settings
