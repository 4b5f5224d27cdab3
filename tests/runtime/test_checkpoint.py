import logging
import os
import random

import numpy as np
import pytest
import torch

from training_runtime import checkpoint as ckpt


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
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [4, 3]


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
    writer.save(1, ckpt.copy_to_cpu({"step": 1, "model": live}))
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
