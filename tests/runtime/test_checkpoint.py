import json
import logging
import os
import random
import threading
import time

import numpy as np
import pytest
import torch

from training_runtime.checkpoint import full as ckpt
from training_runtime.checkpoint.staging import copy_to_cpu


def _state(step: int) -> dict:
    return {"step": step, "model": {"w": torch.full((4,), float(step))}, "history": {"loss": [[step, 0.5]]}}


def test_write_verify_load_round_trip(tmp_path):
    path = ckpt.write_checkpoint(tmp_path, 7, _state(7))
    assert path.name == "step_000000007"
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "state.pt"]
    ckpt.verify_checkpoint(path)
    state = ckpt.load_state(path)
    torch.testing.assert_close(state["model"]["w"], torch.full((4,), 7.0))
    assert [p.name for p in tmp_path.iterdir()] == ["step_000000007"]  # no temporaries left


def test_corrupt_newest_is_skipped_with_reason(tmp_path, caplog):
    for step in (4, 8, 12):
        ckpt.write_checkpoint(tmp_path, step, _state(step))
    newest = tmp_path / "step_000000012" / "state.pt"
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    newest.write_bytes(bytes(raw))
    (tmp_path / "step_000000008" / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING):
        path, state = ckpt.find_latest_valid(tmp_path)
    assert path.name == "step_000000004" and state["step"] == 4
    assert "step_000000012: state.pt sha256" in caplog.text
    assert "step_000000008: manifest.json missing" in caplog.text


def test_no_checkpoint_gives_none(tmp_path):
    assert ckpt.find_latest_valid(tmp_path / "absent") is None


def test_keep_last_prunes_oldest(tmp_path):
    writer = ckpt.CheckpointWriter(str(tmp_path), keep_last=2, async_save=False)
    for step in (1, 2, 3, 4):
        writer.save(step, _state(step))
    writer.wait()
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [4, 3]


def test_sync_save_returns_once_written_and_prunes_only_once_it_is_on_disk(tmp_path, monkeypatch):
    writer = ckpt.CheckpointWriter(str(tmp_path), keep_last=1, async_save=False)
    writer.save(1, _state(1))
    writer.wait()
    fsynced = threading.Event()
    durable_called = threading.Event()
    real = ckpt.make_durable

    def slow_disk(path):
        durable_called.set()
        fsynced.wait(10)
        real(path)

    monkeypatch.setattr(ckpt, "make_durable", slow_disk)
    state = _state(2)
    writer.save(2, state)
    state["model"]["w"].add_(100)  # training goes on at once: the checkpoint holds the values at save time
    assert durable_called.wait(10)  # published by the writer's thread, which now waits for the disk
    assert ckpt.find_latest_valid(tmp_path)[1]["model"]["w"].tolist() == [2.0] * 4
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2, 1]  # the older one is kept until the fsync
    fsynced.set()
    writer.wait()
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2]


@pytest.mark.parametrize("async_save", [False, True])
def test_a_checkpoint_the_disk_did_not_take_is_unpublished_and_the_older_ones_stay(tmp_path, monkeypatch,
                                                                                   async_save):
    writer = ckpt.CheckpointWriter(str(tmp_path), keep_last=1, async_save=async_save)
    writer.save(1, _state(1))
    writer.wait()

    def eio(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ckpt, "make_durable", eio)
    writer.save(2, _state(2))
    with pytest.raises(RuntimeError, match="writing a checkpoint .* Input/output error"):
        writer.wait()
    assert [p.name for p in tmp_path.iterdir()] == ["step_000000001"]
    assert ckpt.find_latest_valid(tmp_path)[1]["step"] == 1


def test_the_streamed_hash_is_the_files_sha256(tmp_path):
    import hashlib

    # many small records and one that spans several of the hasher's 16 MB maps, at odd offsets
    state = {"step": 3, "model": {f"w{i}": torch.randn(257, 129) for i in range(20)},
             "big": torch.randn(9_000_001)}
    path = ckpt.write_checkpoint(tmp_path, 3, state, durable=False)
    ckpt.make_durable(path)
    data = (path / "state.pt").read_bytes()
    meta = json.loads((path / "manifest.json").read_text())["files"]["state.pt"]
    assert meta == {"sha256": hashlib.sha256(data).hexdigest(), "num_bytes": len(data)}
    assert torch.equal(ckpt.load_state(path)["model"]["w7"], state["model"]["w7"])


def test_a_failed_serialisation_leaves_no_checkpoint(tmp_path):
    class Unpicklable:
        def __reduce__(self):
            raise TypeError("cannot pickle this")

    with pytest.raises(TypeError, match="cannot pickle"):
        ckpt.write_checkpoint(tmp_path, 1, {"step": 1, "w": torch.ones(1000), "bad": Unpicklable()})
    assert ckpt.list_checkpoints(tmp_path) == []
    ckpt.remove_stale_temporaries(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_crash_before_rename_leaves_previous_checkpoints_intact(tmp_path, monkeypatch):
    ckpt.write_checkpoint(tmp_path, 1, _state(1))
    real_replace = os.replace

    def crash(src, dst):
        if "step_000000002" in str(dst):
            raise OSError("simulated crash")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        ckpt.write_checkpoint(tmp_path, 2, _state(2))
    monkeypatch.undo()
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [1]
    assert any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    ckpt.remove_stale_temporaries(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["step_000000001"]
    assert ckpt.find_latest_valid(tmp_path)[1]["step"] == 1


def test_async_writer_saves_the_copy_taken_at_save_time(tmp_path):
    writer = ckpt.CheckpointWriter(str(tmp_path), keep_last=3, async_save=True)
    live = {"w": torch.zeros(1000)}
    writer.save(1, copy_to_cpu({"step": 1, "model": live}))
    live["w"].add_(1.0)  # training goes on mutating the parameters
    writer.wait()
    saved = ckpt.load_state(tmp_path / "step_000000001")
    assert saved["model"]["w"].sum().item() == 0.0


def test_async_writer_surfaces_write_errors(tmp_path):
    target = tmp_path / "file"
    target.write_text("not a directory")
    writer = ckpt.CheckpointWriter(str(target), keep_last=1, async_save=True)
    writer.save(1, _state(1))
    with pytest.raises(RuntimeError, match="writing a checkpoint"):
        writer.wait()


def test_rng_state_round_trips_through_weights_only_load(tmp_path):
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    state = ckpt.rng_state(torch.device("cpu"))
    expected = (torch.rand(3), np.random.rand(3), random.random())
    ckpt.atomic_torch_save(tmp_path / "rng.pt", state)
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    ckpt.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), torch.device("cpu"))
    torch.testing.assert_close(torch.rand(3), expected[0])
    np.testing.assert_array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


def test_atomic_write_json_replaces_whole_file(tmp_path):
    ckpt.atomic_write_json(tmp_path / "m.json", {"a": 1})
    ckpt.atomic_write_json(tmp_path / "m.json", {"b": 2})
    assert (tmp_path / "m.json").read_text().strip() == '{\n  "b": 2\n}'
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_a_manifest_naming_a_file_outside_the_checkpoint_is_refused(tmp_path):
    path = ckpt.write_checkpoint(tmp_path / "c", 3, _state(3))
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"x")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["../../elsewhere.bin"] = {"sha256": ckpt.hashlib.sha256(b"x").hexdigest(), "num_bytes": 1}
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="lies outside the checkpoint directory"):
        ckpt.verify_checkpoint(path)


class _Counted(torch.nn.Module):
    """A linear layer with a buffer its forward updates in place, as batch norm's statistics."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.register_buffer("seen", torch.zeros(64))

    def forward(self, x):
        self.seen.add_(1.0)
        return self.lin(x)


def _slow_copies(monkeypatch, delay_s=0.3):
    """The deferred copies start only after ``delay_s``: training that does not wait for them
    changes the tensors first."""
    from training_runtime.checkpoint import staging

    run = staging.DeferredCopy.run

    def slow(self):
        time.sleep(delay_s)
        run(self)

    monkeypatch.setattr(staging.DeferredCopy, "run", slow)


def _train_step(model, opt):
    model(torch.randn(8, 64)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def test_async_save_with_the_optimizer_holds_the_state_of_save_time_while_training_goes_on(tmp_path, monkeypatch):
    _slow_copies(monkeypatch)
    torch.manual_seed(0)
    model = _Counted()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    _train_step(model, opt)
    expected = copy_to_cpu({"model": model.state_dict(), "optimizer": opt.state_dict()})
    writer = ckpt.CheckpointWriter(str(tmp_path), keep_last=1, async_save=True)
    writer.save(1, {"step": 1, "model": model.state_dict(), "optimizer": opt.state_dict()}, opt)
    t0 = time.perf_counter()
    _train_step(model, opt)  # the forward changes the buffer at once, the step the parameters and moments
    assert time.perf_counter() - t0 >= 0.2  # the step waited for the deferred copy
    assert writer.take_deferred_wait_s() >= 0.2
    writer.wait()
    saved = ckpt.load_state(tmp_path / "step_000000001")
    for k, v in expected["model"].items():
        assert torch.equal(saved["model"][k], v), k
    for i, s in expected["optimizer"]["state"].items():
        for k, v in s.items():
            assert torch.equal(saved["optimizer"]["state"][i][k], v), (i, k)
    assert not torch.equal(saved["model"]["lin.weight"], model.lin.weight.detach())  # training did go on


def test_a_failed_deferred_copy_fails_the_checkpoint_without_holding_training(tmp_path, monkeypatch):
    from training_runtime.checkpoint import staging

    def broken(self):
        try:
            raise OSError("host memory gone")
        finally:
            self.done.set()

    monkeypatch.setattr(staging.DeferredCopy, "run", broken)
    model = _Counted()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = ckpt.CheckpointWriter(str(tmp_path), keep_last=1, async_save=True)
    writer.save(1, {"step": 1, "model": model.state_dict()}, opt)
    _train_step(model, opt)  # does not hang on the fence
    with pytest.raises(RuntimeError, match="writing a checkpoint.*host memory gone"):
        writer.wait()
    assert ckpt.find_latest_valid(tmp_path) is None
