"""Model registry: built-in models for tables (MLP, CNN, transformer encoder), images (ResNet) and
text (a causal language model and an encoder classifier), plus user factories by import path.

Every factory takes ``(input_shape, num_classes, **kwargs)``: ``input_shape`` is one sample as the
model reads it (images [C, H, W], tokens [L]) and ``num_classes`` the number of outputs the task
wants (the vocabulary size for a language model). Token models also accept ``vocab_size`` (and the
classifier ``pad_id``), which the runtime passes when the data has them."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from training_runtime.models.names import BUILTIN_MODELS


class MLP(nn.Module):
    def __init__(self, input_shape: Sequence[int], num_classes: int,
                 hidden_sizes: Sequence[int] = (128, 128), dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in hidden_sizes:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def image_shape(input_shape: Sequence[int], model: str = "cnn") -> tuple[int, int, int]:
    """[C, H, W] as is; [H, W] as one channel; [D] with D a perfect square as a one-channel
    sqrt(D) x sqrt(D) image. ``model`` names the model in the error."""
    if len(input_shape) == 3:
        return tuple(input_shape)  # type: ignore[return-value]
    if len(input_shape) == 1 and math.isqrt(input_shape[0]) ** 2 == input_shape[0]:
        s = math.isqrt(input_shape[0])
        return (1, s, s)
    if len(input_shape) == 2:
        return (1, *input_shape)  # type: ignore[return-value]
    raise ValueError(f"model {model!r} needs feature_shape [C, H, W], [H, W] or [D] with D a perfect "
                     f"square, got {list(input_shape)}; pick another model.name")


class AvgPoolTo(nn.Module):
    """AdaptiveAvgPool2d to ``size`` x ``size``, through avg_pool2d when the size divides the input
    evenly (the same numbers): CUDA's adaptive_avg_pool2d backward adds with atomics, so it is
    nondeterministic and refused under torch.use_deterministic_algorithms; avg_pool2d's is not."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x.mean((-2, -1), keepdim=True)
        if torch.onnx.is_in_onnx_export():  # exported graphs keep the adaptive op (sizes are symbolic there)
            return F.adaptive_avg_pool2d(x, self.size)
        h, w = x.shape[-2:]
        if h % self.size == 0 and w % self.size == 0:
            return F.avg_pool2d(x, (h // self.size, w // self.size))
        return F.adaptive_avg_pool2d(x, self.size)


def deterministic_attention(x: torch.Tensor):
    """Under torch.use_deterministic_algorithms on CUDA, keep scaled_dot_product_attention off the
    flash kernel, whose backward is nondeterministic (and refused in that mode): the
    memory-efficient kernel has a deterministic backward in that mode, the math one is the
    fallback. Otherwise no restriction."""
    if not (x.is_cuda and torch.are_deterministic_algorithms_enabled()):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class CNN(nn.Module):
    def __init__(self, input_shape: Sequence[int], num_classes: int, channels: int = 32,
                 dropout: float = 0.0):
        super().__init__()
        self.shape = image_shape(input_shape)
        c = self.shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
            AvgPoolTo(2), nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(8 * channels, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.reshape(x.shape[0], *self.shape)))


class TransformerClassifier(nn.Module):
    """Features as a token sequence: [L, D] is L tokens of D features; [N] is N / patch_size
    patches of patch_size features. Mean-pooled pre-norm encoder, linear head."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, d_model: int = 64,
                 nhead: int = 4, num_layers: int = 2, dim_feedforward: int = 128,
                 patch_size: int | None = None, dropout: float = 0.0):
        super().__init__()
        if len(input_shape) == 2:
            self.seq_len, token_dim = input_shape
        elif len(input_shape) == 1:
            n = input_shape[0]
            p = patch_size or next(d for d in (8, 4, 2, 1) if n % d == 0)
            if n % p:
                raise ValueError(f"model.kwargs.patch_size={p} must divide feature_shape {n}")
            self.seq_len, token_dim = n // p, p
        else:
            raise ValueError(f"model 'transformer' needs feature_shape [N] or [L, D], got {list(input_shape)}")
        if d_model % nhead:
            raise ValueError(f"model.kwargs.d_model={d_model} must be divisible by nhead={nhead}")
        self.token_dim = token_dim
        self.embed = nn.Linear(token_dim, d_model)
        self.pos = nn.Parameter(torch.zeros(1, self.seq_len, d_model))
        nn.init.normal_(self.pos, std=0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout,
                                       batch_first=True, norm_first=True)
            for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(x.shape[0], self.seq_len, self.token_dim)) + self.pos
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h).mean(dim=1))


class BasicBlock(nn.Module):
    """Two 3x3 conv + BatchNorm layers and a shortcut (identity, or 1x1 conv + BatchNorm where the
    stride or width changes). The BatchNorms start at scale 1: zero-initialising the second (as
    deep ResNets do) made these shallow ones learn several times slower in short runs."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class PerImageStandardize(nn.Module):
    """Each channel of each image to zero mean and unit variance over its pixels. (What
    nn.InstanceNorm2d computes, written out: the ONNX exporter warns that InstanceNorm runs in
    training mode when asked for an eval-mode export.)"""

    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=(2, 3), keepdim=True)
        var = x.var(dim=(2, 3), keepdim=True, unbiased=False)
        return (x - mean) * torch.rsqrt(var + self.eps)


class ResNet(nn.Module):
    """A small ResNet for images: conv3x3 stem (stride ``stem_stride``; 2 quarters the cost on
    64x64 and larger images), one stage of BasicBlocks per entry of ``widths`` (stride 2 between
    stages), global average pool, dropout, linear head.

    With ``standardize_input`` each image's channels are first scaled to zero mean and unit
    variance over the image, so its overall colour and brightness do not reach the network. On
    the shapes example (random background and shape colours, 400 training images) that is what
    lets it learn in a few epochs: 10 epochs (AdamW, lr 0.01, weight decay 0.05, cosine, batch
    32, stem_stride 2) reached 0.66 held-out accuracy with it and 0.29 without it. Turn it off
    when overall colour or brightness is what tells the classes apart."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, widths: Sequence[int] = (32, 64, 128),
                 blocks_per_stage: int = 1, dropout: float = 0.0, stem_stride: int = 1,
                 standardize_input: bool = True):
        super().__init__()
        self.shape = image_shape(input_shape, "resnet")
        widths = list(widths)
        if not widths or any(int(w) != w or w < 1 for w in widths):
            raise ValueError(f"model.kwargs.widths must be a non-empty list of positive channel counts, got {widths}")
        if blocks_per_stage < 1:
            raise ValueError(f"model.kwargs.blocks_per_stage must be >= 1, got {blocks_per_stage}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"model.kwargs.dropout must be in [0, 1), got {dropout}")
        if stem_stride < 1:
            raise ValueError(f"model.kwargs.stem_stride must be >= 1, got {stem_stride}")
        self.standardize: nn.Module = PerImageStandardize() if standardize_input else nn.Identity()
        self.stem = nn.Sequential(nn.Conv2d(self.shape[0], widths[0], 3, stride=stem_stride, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks: list[nn.Module] = []
        width = widths[0]
        for stage, out in enumerate(widths):
            for i in range(blocks_per_stage):
                blocks.append(BasicBlock(width, out, stride=2 if stage > 0 and i == 0 else 1))
                width = out
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(AvgPoolTo(1), nn.Flatten(), nn.Dropout(dropout),
                                  nn.Linear(width, num_classes))
        # He init, as torchvision's ResNets: larger conv weights than PyTorch's default, so an
        # Adam step changes them by a smaller fraction and BatchNorm's running statistics lag less.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.standardize(x.reshape(x.shape[0], *self.shape))
        return self.head(self.blocks(self.stem(x)))


class SelfAttention(nn.Module):
    """Multi-head self-attention through F.scaled_dot_product_attention (fused kernels on GPU; the
    legacy ONNX exporter has a symbolic for it). ``keep`` is a bool [N, 1, 1, L] mask of the keys
    a query may attend to; ``causal`` restricts each position to itself and earlier ones."""

    def __init__(self, d_model: int, nhead: int, dropout: float):
        super().__init__()
        self.nhead, self.dropout = nhead, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, *, causal: bool, keep: torch.Tensor | None = None) -> torch.Tensor:
        n, length, d = x.shape
        q, k, v = self.qkv(x).reshape(n, length, 3, self.nhead, d // self.nhead).permute(2, 0, 3, 1, 4).unbind(0)
        with deterministic_attention(x):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal,
                                               dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(n, length, d))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)). FSDP shards each
    block as a unit (``shardable_submodules``)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, causal: bool):
        super().__init__()
        self.causal = causal
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, nhead, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, dim_feedforward), nn.GELU(),
                                 nn.Linear(dim_feedforward, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x), causal=self.causal, keep=keep))
        return x + self.drop(self.mlp(self.norm2(x)))


def _check_transformer_kwargs(model: str, d_model: int, nhead: int, num_layers: int,
                              dim_feedforward: int, dropout: float) -> None:
    for name, value in (("d_model", d_model), ("nhead", nhead), ("num_layers", num_layers),
                        ("dim_feedforward", dim_feedforward)):
        if value < 1:
            raise ValueError(f"model.kwargs.{name} must be >= 1 for model {model!r}, got {value}")
    if d_model % nhead:
        raise ValueError(f"model.kwargs.d_model={d_model} must be divisible by nhead={nhead}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"model.kwargs.dropout must be in [0, 1), got {dropout}")


def _token_sequence_length(input_shape: Sequence[int], model: str) -> int:
    if len(input_shape) != 1 or input_shape[0] < 1:
        raise ValueError(f"model {model!r} needs token sequences, feature_shape [L], got {list(input_shape)}; "
                         "pick another model.name")
    return int(input_shape[0])


class TokenEncoder(nn.Module):
    """Token + learned position embeddings, a stack of TransformerBlocks and a final LayerNorm: the
    body shared by the language model and the text classifier. Sequences may be shorter than
    ``max_len`` (generation, short documents), never longer: there is no position for them."""

    def __init__(self, model: str, max_len: int, vocab_size: int, d_model: int, nhead: int, num_layers: int,
                 dim_feedforward: int, dropout: float, causal: bool, pad_id: int | None = None):
        super().__init__()
        _check_transformer_kwargs(model, d_model, nhead, num_layers, dim_feedforward, dropout)
        self.model_name, self.max_len = model, max_len
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.pos = nn.Parameter(torch.zeros(1, max_len, d_model))
        # Small embeddings: N(0, 1) ones make a tied head's first logits huge.
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(TransformerBlock(d_model, nhead, dim_feedforward, dropout, causal)
                                    for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"model {self.model_name!r} takes int64 tokens [N, L], got shape {list(tokens.shape)}")
        length = tokens.shape[1]
        # (Not while tracing for ONNX: the comparison would be baked into the graph with a warning.)
        if not torch.jit.is_tracing() and length > self.max_len:
            raise ValueError(f"model {self.model_name!r} got {length} tokens but was built for at most "
                             f"max_len={self.max_len} (feature_shape [L]); crop the input to its last "
                             f"{self.max_len} tokens")
        h = self.drop(self.embed(tokens) + self.pos[:, :length])
        for layer in self.layers:
            h = layer(h, keep)
        return self.norm(h)


class TransformerLM(nn.Module):
    """Causal decoder-only language model on tokens [L]: logits [N, L, vocab] where position t
    predicts token t + 1 from tokens 0..t. The vocabulary is ``num_classes`` (the language-model
    task passes the vocabulary size as the number of outputs); the head shares the embedding's
    weights when ``tie_weights``."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, vocab_size: int | None = None,
                 d_model: int = 128, nhead: int = 4, num_layers: int = 2, dim_feedforward: int = 512,
                 dropout: float = 0.0, tie_weights: bool = True):
        super().__init__()
        if vocab_size is not None and vocab_size != num_classes:
            raise ValueError(f"model.kwargs.vocab_size={vocab_size} must equal the number of outputs "
                             f"{num_classes}: a language model predicts one of vocab_size tokens")
        if num_classes < 1:
            raise ValueError(f"model 'transformer_lm' needs a vocabulary of >= 1 tokens, got {num_classes}")
        self.max_len = _token_sequence_length(input_shape, "transformer_lm")
        self.encoder = TokenEncoder("transformer_lm", self.max_len, num_classes, d_model, nhead, num_layers,
                                    dim_feedforward, dropout, causal=True)
        self.head = nn.Linear(d_model, num_classes, bias=False)
        if tie_weights:
            self.head.weight = self.encoder.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(tokens))


class TextTransformer(nn.Module):
    """Bidirectional encoder classifier on tokens [L]: logits [N, num_classes] from the mean of the
    encoded non-padding positions. Positions holding ``pad_id`` are masked out of attention and
    of the pool, so how a document is padded does not change its prediction."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, vocab_size: int | None = None,
                 pad_id: int | None = None, d_model: int = 128, nhead: int = 4, num_layers: int = 2,
                 dim_feedforward: int = 512, dropout: float = 0.0):
        super().__init__()
        if vocab_size is None:
            raise ValueError("model 'text_transformer' needs model.kwargs.vocab_size (the tokenizer's "
                             "vocabulary size); the runtime passes it from a text manifest's tokenizer")
        if vocab_size < 1:
            raise ValueError(f"model.kwargs.vocab_size must be >= 1, got {vocab_size}")
        if pad_id is not None and not 0 <= pad_id < vocab_size:
            raise ValueError(f"model.kwargs.pad_id={pad_id} must be a token id in 0..{vocab_size - 1}")
        self.pad_id = pad_id
        self.max_len = _token_sequence_length(input_shape, "text_transformer")
        self.encoder = TokenEncoder("text_transformer", self.max_len, vocab_size, d_model, nhead, num_layers,
                                    dim_feedforward, dropout, causal=False, pad_id=pad_id)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.pad_id is None:
            return self.head(self.encoder(tokens).mean(dim=1))
        real = tokens != self.pad_id  # [N, L]
        # An all-padding document would leave its queries nothing to attend to (NaN in ONNX, and in
        # some fused kernels); let it attend to everything instead. The pool below ignores it anyway.
        keep = real | ~real.any(dim=1, keepdim=True)
        h = self.encoder(tokens, keep[:, None, None, :])
        weight = real.unsqueeze(-1).to(h.dtype)
        pooled = (h * weight).sum(dim=1) / weight.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)


REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "cnn": CNN, "mlp": MLP, "resnet": ResNet, "text_transformer": TextTransformer,
    "transformer": TransformerClassifier, "transformer_lm": TransformerLM,
}
assert sorted(REGISTRY) == list(BUILTIN_MODELS), "model_names.BUILTIN_MODELS must list REGISTRY's names"


def resolve_factory(name: str) -> Callable[..., nn.Module]:
    if name in REGISTRY:
        return REGISTRY[name]
    if ":" not in name:
        raise ValueError(f"model.name {name!r} is unknown; use one of {sorted(REGISTRY)} or an "
                         "import path 'pkg.module:factory'")
    module, _, attr = name.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"model.name {name!r} cannot be imported ({e}); check the import path") from e
    if not callable(factory):
        raise ValueError(f"model.name {name!r} is not callable")
    return factory


def build_model(name: str, input_shape: Sequence[int], num_classes: int, **kwargs) -> nn.Module:
    """Build a model by registry name or 'pkg.module:factory'. Raises ValueError naming
    model.name / model.kwargs when the model or its arguments are wrong."""
    factory = resolve_factory(name)
    try:
        inspect.signature(factory).bind(input_shape=list(input_shape), num_classes=num_classes, **kwargs)
    except TypeError as e:
        raise ValueError(f"model.kwargs {kwargs} do not fit model {name!r}: {e}") from e
    except ValueError:
        pass  # builtins without an introspectable signature: let the call report
    model = factory(input_shape=list(input_shape), num_classes=num_classes, **kwargs)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model.name {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def shardable_submodules(model: nn.Module) -> list[nn.Module]:
    """Modules FSDP shards as their own units: the transformer layers or residual blocks. Each
    unit is one all-gather before its forward and one reduce-scatter after its backward, so a unit
    should be a block's worth of compute that hides the next block's all-gather. A model without
    such blocks (the MLP, the small CNN) is one unit, the root: a unit per Linear or Conv would
    pay a collective's latency for every layer and save little memory. The root takes what no
    unit holds (the embeddings and a head tied to them stay together in the root). The platform's
    own models only: a user's model gets the units its pipeline names, or size-based ones
    (``training_runtime.distributed.units``)."""
    return [m for m in model.modules() if isinstance(m, (nn.TransformerEncoderLayer, TransformerBlock, BasicBlock))]
