"""The built-in image and text models (resnet, transformer_lm, text_transformer) and generation."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from training_runtime.serve.generate import generate
from training_runtime.models.builtin import BasicBlock, TransformerBlock, build_model, shardable_submodules

VOCAB = 20
PAD = 0
TINY_TRANSFORMER = {"d_model": 16, "nhead": 2, "num_layers": 2, "dim_feedforward": 32}


def tiny_resnet(shape=(3, 16, 16), num_classes=3, **kwargs):
    return build_model("resnet", list(shape), num_classes, **{"widths": [4, 8], **kwargs})


def tiny_lm(max_len=12, **kwargs):
    return build_model("transformer_lm", [max_len], VOCAB, **{**TINY_TRANSFORMER, **kwargs})


def tiny_classifier(max_len=12, num_classes=3, **kwargs):
    return build_model("text_transformer", [max_len], num_classes,
                       **{"vocab_size": VOCAB, "pad_id": PAD, **TINY_TRANSFORMER, **kwargs})


def padded(docs: list[list[int]], length: int) -> torch.Tensor:
    return torch.tensor([doc + [PAD] * (length - len(doc)) for doc in docs])


@pytest.mark.parametrize("shape", [(3, 16, 16), (8, 8), (64,)])
def test_resnet_maps_images_to_logits(shape):
    torch.manual_seed(0)
    model = tiny_resnet(shape, 5, blocks_per_stage=2, dropout=0.1)
    out = model(torch.randn(4, *shape))
    assert out.shape == (4, 5)
    out.sum().backward()
    assert len([m for m in model.modules() if isinstance(m, BasicBlock)]) == 4


def test_resnet_stem_stride_downsamples_before_the_blocks():
    model = tiny_resnet((3, 16, 16), stem_stride=2)
    features = model.blocks(model.stem(torch.randn(2, 3, 16, 16)))
    assert features.shape == (2, 8, 4, 4)  # 16 / 2 (stem) / 2 (second stage)


def test_resnet_ignores_each_images_overall_colour_and_brightness_unless_told_not_to():
    torch.manual_seed(0)
    images = torch.randn(4, 3, 16, 16)
    scale, shift = torch.tensor([2.0, 0.5, 1.5]).view(1, 3, 1, 1), torch.tensor([1.0, -3.0, 0.2]).view(1, 3, 1, 1)
    recoloured = images * scale + shift
    for standardize, same in ((True, True), (False, False)):
        model = tiny_resnet(standardize_input=standardize).eval()
        with torch.no_grad():
            assert torch.allclose(model(images), model(recoloured), atol=1e-4) is same


def test_transformer_lm_gives_next_token_logits_for_every_position_and_shorter_inputs():
    torch.manual_seed(0)
    model = tiny_lm(vocab_size=VOCAB)
    out = model(torch.randint(0, VOCAB, (3, 12)))
    assert out.shape == (3, 12, VOCAB)
    out.sum().backward()
    assert model(torch.randint(0, VOCAB, (2, 5))).shape == (2, 5, VOCAB)
    assert model.head.weight is model.encoder.embed.weight
    assert tiny_lm(tie_weights=False).head.weight is not tiny_lm(tie_weights=False).encoder.embed.weight
    with pytest.raises(ValueError, match="got 13 tokens but was built for at most max_len=12"):
        model(torch.zeros(1, 13, dtype=torch.long))


def test_text_transformer_maps_tokens_to_class_logits():
    torch.manual_seed(0)
    out = tiny_classifier(num_classes=4)(torch.randint(0, VOCAB, (3, 12)))
    assert out.shape == (3, 4)
    out.sum().backward()
    without_pad = build_model("text_transformer", [12], 2, vocab_size=VOCAB, **TINY_TRANSFORMER)
    assert without_pad(torch.randint(0, VOCAB, (3, 12))).shape == (3, 2)


@pytest.mark.parametrize("build", [lambda: tiny_resnet(), lambda: build_model("resnet", [3, 64, 64], 3),
                                   lambda: tiny_lm(), lambda: build_model("transformer_lm", [256], 4096),
                                   lambda: tiny_classifier()])
def test_models_build_on_the_meta_device(build):
    with torch.device("meta"):
        model = build()
    params = list(model.parameters())
    assert params and all(p.is_meta for p in params)


@pytest.mark.parametrize("name, shape, num_classes, kwargs, message", [
    ("resnet", [3, 8, 8], 3, {"widths": []}, "model.kwargs.widths must be a non-empty list"),
    ("resnet", [3, 8, 8], 3, {"blocks_per_stage": 0}, "model.kwargs.blocks_per_stage must be >= 1"),
    ("resnet", [3, 8, 8], 3, {"depth": 18}, "model.kwargs .* do not fit model 'resnet'"),
    ("resnet", [10], 3, {}, "model 'resnet' needs feature_shape"),
    ("transformer_lm", [8], VOCAB, {"vocab_size": VOCAB + 1}, f"model.kwargs.vocab_size={VOCAB + 1} must equal"),
    ("transformer_lm", [8], VOCAB, {"d_model": 10, "nhead": 4}, "model.kwargs.d_model=10 must be divisible"),
    ("transformer_lm", [8], VOCAB, {"num_layers": 0}, "model.kwargs.num_layers must be >= 1"),
    ("transformer_lm", [8], VOCAB, {"pad_id": 0}, "model.kwargs .* do not fit model 'transformer_lm'"),
    ("transformer_lm", [4, 2], VOCAB, {}, r"needs token sequences, feature_shape \[L\]"),
    ("text_transformer", [8], 3, {}, "needs model.kwargs.vocab_size"),
    ("text_transformer", [8], 3, {"vocab_size": VOCAB, "pad_id": VOCAB}, "model.kwargs.pad_id=20 must be a token id"),
    ("text_transformer", [8], 3, {"vocab_size": VOCAB, "dropout": 1.0}, r"model.kwargs.dropout must be in \[0, 1\)"),
])
def test_wrong_kwargs_name_the_setting(name, shape, num_classes, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_model(name, shape, num_classes, **kwargs)


def test_transformer_lm_is_causal():
    torch.manual_seed(0)
    model = tiny_lm().eval()
    tokens = torch.randint(0, VOCAB, (2, 12))
    t = 6
    changed = tokens.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % VOCAB
    with torch.no_grad():
        out, out_changed = model(tokens), model(changed)
    torch.testing.assert_close(out[:, :t + 1], out_changed[:, :t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(out[:, t + 1:], out_changed[:, t + 1:], atol=1e-3)


def test_text_transformer_ignores_padding():
    torch.manual_seed(0)
    model = tiny_classifier().eval()
    docs = [[5, 6, 7], [3, 9, 4, 11, 2], [8]]
    with torch.no_grad():
        out = model(padded(docs, 12))
        # Each document alone and unpadded gives the same logits as padded in a batch.
        for i, doc in enumerate(docs):
            torch.testing.assert_close(model(torch.tensor([doc])), out[i:i + 1], rtol=0, atol=1e-5)
        # Whatever the padding token's embedding is, the prediction is the same.
        model.encoder.embed.weight[PAD].normal_()
        torch.testing.assert_close(model(padded(docs, 12)), out, rtol=0, atol=1e-5)
        # A real token does count, and a document of padding alone still gives finite logits.
        assert not torch.allclose(model(padded([[5, 6, 8]], 12)), out[:1], atol=1e-4)
        assert torch.isfinite(model(padded([[]], 12))).all()


def loss_drops(model, batches, loss_fn, steps=12, lr=3e-3) -> tuple[float, float]:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = batches[step % len(batches)]
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses[0], float(np.mean(losses[-3:]))


def test_resnet_learns_a_tiny_image_task():
    torch.manual_seed(0)
    # The class is the channel that holds a bright square.
    images = torch.randn(48, 3, 12, 12) * 0.3
    labels = torch.arange(48) % 3
    for i, c in enumerate(labels):
        images[i, c, 3:9, 3:9] += 2.0
    batches = [(images[i:i + 16], labels[i:i + 16]) for i in range(0, 48, 16)]
    first, last = loss_drops(tiny_resnet((3, 12, 12), widths=[8, 16]), batches, F.cross_entropy, lr=1e-2)
    assert last < 0.5 * first


def test_transformer_lm_learns_a_repeating_sequence():
    torch.manual_seed(0)
    starts = torch.randint(0, VOCAB, (16, 1))
    windows = (starts + 3 * torch.arange(13)) % VOCAB  # next token = this token + 3
    batches = [(windows[i:i + 8, :-1], windows[i:i + 8, 1:]) for i in (0, 8)]
    first, last = loss_drops(tiny_lm(), batches,
                             lambda logits, y: F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)),
                             steps=20, lr=1e-2)
    assert last < 0.5 * first


def test_shardable_submodules_are_the_blocks():
    assert [type(m) for m in shardable_submodules(tiny_resnet(blocks_per_stage=2))] == [BasicBlock] * 4
    for model in (tiny_lm(), tiny_classifier()):
        units = shardable_submodules(model)
        assert [type(m) for m in units] == [TransformerBlock] * 2
        # The embeddings (and the head tied to them) stay with the root.
        assert all(model.encoder.embed.weight is not p for m in units for p in m.parameters())


class NextTokenModel(nn.Module):
    """Logits that favour (token + 1) % vocab, with a little spread so sampling has a choice;
    records the contexts it was given and the training mode it ran in."""

    def __init__(self, vocab: int = VOCAB):
        super().__init__()
        self.vocab = vocab
        self.scale = nn.Parameter(torch.tensor(3.0))
        self.contexts: list[list[int]] = []
        self.modes: list[bool] = []

    def forward(self, tokens):
        self.contexts.append(tokens[0].tolist())
        self.modes.append(self.training)
        return self.scale * F.one_hot((tokens + 1) % self.vocab, self.vocab).float()


def test_greedy_generation_follows_the_most_likely_token_and_stops_at_eos():
    model = NextTokenModel()
    assert generate(model, [3], 5, max_len=4, temperature=0) == [4, 5, 6, 7, 8]
    assert generate(model, [3], 10, max_len=4, temperature=0, eos_id=6) == [4, 5, 6]
    assert generate(model, [3], 10, max_len=4, temperature=2.0, top_k=1, seed=5) == list(range(4, 14))
    assert generate(model, [3], 0, max_len=4) == []


def test_generation_crops_the_context_to_max_len():
    model = NextTokenModel()
    generate(model, [1, 2, 3, 4, 5, 6], 3, max_len=4, temperature=0)
    assert model.contexts == [[3, 4, 5, 6], [4, 5, 6, 7], [5, 6, 7, 8]]


def test_sampling_is_seeded_and_runs_in_eval_mode_without_gradients():
    model = NextTokenModel().train()
    a = generate(model, [0], 30, max_len=8, seed=1)
    assert a == generate(model, [0], 30, max_len=8, seed=1)
    assert a != generate(model, [0], 30, max_len=8, seed=2)
    assert a != [(i + 1) % VOCAB for i in range(30)]  # sampled, not greedy
    assert model.training and not any(model.modes)
    assert model.scale.grad is None


def test_generation_with_the_language_model_runs_past_its_max_len():
    torch.manual_seed(0)
    model = tiny_lm(max_len=8)
    prompt = torch.randint(0, VOCAB, (10,)).tolist()
    new = generate(model, prompt, 6, max_len=8, temperature=0.8, top_k=5, seed=3)
    assert len(new) == 6 and all(0 <= t < VOCAB for t in new)
    assert new == generate(model, prompt, 6, max_len=8, temperature=0.8, top_k=5, seed=3)


@pytest.mark.parametrize("bad, message", [
    ({"prompt": []}, "non-empty prompt"), ({"max_new_tokens": -1}, "max_new_tokens must be >= 0"),
    ({"max_len": 0}, "max_len must be >= 1"), ({"temperature": -1.0}, "temperature must be >= 0"),
    ({"top_k": 0}, "top_k must be >= 1"),
])
def test_generation_arguments_are_checked(bad, message):
    args = {"prompt": [1], "max_new_tokens": 2, "max_len": 4, **bad}
    with pytest.raises(ValueError, match=message):
        generate(NextTokenModel(), args.pop("prompt"), args.pop("max_new_tokens"), **args)


@pytest.mark.parametrize("build, make_input", [
    (lambda: tiny_resnet(dropout=0.2), lambda n: torch.randn(n, 3, 16, 16)),
    (lambda: tiny_lm(), lambda n: torch.randint(0, VOCAB, (n, 12))),
    (lambda: tiny_classifier(), lambda n: padded([[1 + (i * 7 + j) % (VOCAB - 1) for j in range(i % 13)]
                                                  for i in range(n)], 12)),
])
def test_onnx_export_agrees_with_torch_at_another_batch_size(tmp_path, build, make_input):
    import onnxruntime

    torch.manual_seed(0)
    model = build()
    with torch.no_grad():
        model.train()(make_input(8))  # BatchNorm: running statistics other than the initial 0 and 1
    model.eval()
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (make_input(2),), str(path), dynamo=False, input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = make_input(14)
    got = session.run(None, {"input": x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    assert got.shape == want.shape and got.shape[0] == 14
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
