"""models.weight_reader: safetensors files read by threads into one buffer per file; the tensors are the files'
(safetensors' own reader is the reference), misaligned ones copied, bad files refused naming the file."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from algorithms.errors import CheckpointError
from models.weight_reader import checkpoint_files, read_header, read_safetensors


def _mixed(tmp_path: Path) -> list[Path]:
    g = torch.Generator().manual_seed(0)
    a = {"odd.bytes": torch.randint(0, 255, (3,), dtype=torch.uint8, generator=g),   # 3 bytes: what follows is odd
         "w.bf16": torch.randn(5, 7, generator=g).to(torch.bfloat16),
         "flag": torch.tensor([True, False, True]),
         "w.f32": torch.randn(4, 3, generator=g),
         "scalar": torch.tensor(2.5),
         "empty": torch.zeros(0, 4),
         "ids": torch.arange(9, dtype=torch.int64).view(3, 3)}
    b = {"other.bf16": torch.randn(33, generator=g).to(torch.bfloat16)}
    files = [tmp_path / "model-00001-of-00002.safetensors", tmp_path / "model-00002-of-00002.safetensors"]
    save_file(a, str(files[0]))
    save_file(b, str(files[1]))
    return files


@pytest.mark.parametrize("threads,chunk", [(1, 1 << 20), (3, 16), (8, 7)])
def test_every_tensor_is_the_files_own(tmp_path, threads, chunk):
    files = _mixed(tmp_path)
    got = read_safetensors(files, "cpu", threads=threads, chunk_bytes=chunk)
    want = {**load_file(str(files[0])), **load_file(str(files[1]))}
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k


def test_a_tensor_at_an_offset_no_multiple_of_its_size_is_copied(tmp_path):
    """safetensors' writer aligns its tensors, but the format does not require it: a file written by hand with a
    bfloat16 tensor 3 bytes into the data reads as its bytes say."""
    want = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    data = bytes([7, 8, 9]) + want.view(torch.uint8).numpy().tobytes()
    header = json.dumps({"u": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
                         "w": {"dtype": "BF16", "shape": [3], "data_offsets": [3, 9]}}).encode()
    f = tmp_path / "hand.safetensors"
    f.write_bytes(struct.pack("<Q", len(header)) + header + data)
    start, entries = read_header(f)
    assert start == 8 + len(header) and entries["w"] == (torch.bfloat16, (3,), 3, 9)
    got = read_safetensors([f], "cpu", threads=2, chunk_bytes=4)
    assert torch.equal(got["w"], want) and got["u"].tolist() == [7, 8, 9]


def test_a_file_without_data(tmp_path):
    save_file({"empty": torch.zeros(0, 3)}, str(tmp_path / "e.safetensors"))
    got = read_safetensors([tmp_path / "e.safetensors"], "cpu")
    assert list(got) == ["empty"] and got["empty"].shape == (0, 3)


def test_bad_files_are_named(tmp_path):
    files = _mixed(tmp_path)
    data = files[0].read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:-5])                         # the data ends early: its header's offsets do not fit
    with pytest.raises(CheckpointError, match="cut.safetensors.*truncated"):
        read_safetensors([cut], "cpu")
    short = tmp_path / "short.safetensors"
    short.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="short.safetensors.*8-byte"):
        read_safetensors([short], "cpu")
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header["w.f32"]["dtype"] = "C64"
    text = json.dumps(header).encode()
    odd = tmp_path / "odd.safetensors"
    odd.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])
    with pytest.raises(CheckpointError, match="odd.safetensors: tensor w.f32 has dtype 'C64'"):
        read_safetensors([odd], "cpu")
    with pytest.raises(CheckpointError, match="also in another file"):
        read_safetensors([files[1], files[1]], "cpu")


def test_checkpoint_files_follow_the_index(tmp_path):
    files = _mixed(tmp_path)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        checkpoint_files(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": files[1].name, "b": files[0].name, "c": files[0].name}}))
    assert checkpoint_files(tmp_path) == sorted(files)
    files[1].unlink()
    with pytest.raises(FileNotFoundError, match=files[1].name):
        checkpoint_files(tmp_path)


def test_the_pinned_reader_loads_the_library_s_model(tiny_vl3_dir):
    """``from_pretrained(weight_reader="pinned")``: every parameter and buffer, and the config, as the library's
    loader gives them."""
    from models.videollama3 import BudgetedVideoLlama3

    lib = BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir)
    pinned = BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir, weight_reader="pinned")
    a, b = lib.model.state_dict(), pinned.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    assert lib.model.config.to_dict() == pinned.model.config.to_dict()
    with pytest.raises(ValueError, match="weight_reader"):
        BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir, weight_reader="mmap")


def test_read_ahead_gives_the_readers_tensors_once_and_its_error(tmp_path):
    """``ReadAhead``: the tensors :func:`read_safetensors` reads, taken once; a bad file's error raised by
    ``result()`` in the caller's thread, the file named."""
    from models.weight_reader import ReadAhead

    files = _mixed(tmp_path)
    ahead = ReadAhead(files, "cpu", threads=3)
    got, want = ahead.result(), read_safetensors(files, "cpu")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(RuntimeError, match="already taken"):
        ahead.result()
    files[1].write_bytes(files[1].read_bytes()[:-5])          # cut short
    with pytest.raises(CheckpointError, match=files[1].name):
        ReadAhead(files, "cpu").result()


def test_the_pinned_load_starts_its_reads_before_the_modeling_imports(tiny_vl3_dir, monkeypatch):
    """``from_pretrained(weight_reader="pinned")`` starts the reads (``ReadAhead``) before it imports transformers'
    modeling classes, and loads what they read; a FIFO among the weight files is refused before any read starts."""
    import builtins

    import models.weight_reader as wr
    from models.videollama3 import BudgetedVideoLlama3

    order = []
    real_init, real_import = wr.ReadAhead.__init__, builtins.__import__

    def init(self, *a, **kw):
        order.append("read")
        real_init(self, *a, **kw)

    def imp(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "transformers" and fromlist and "VideoLlama3ForConditionalGeneration" in fromlist:
            order.append("modeling import")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(wr.ReadAhead, "__init__", init)
    monkeypatch.setattr(builtins, "__import__", imp)
    pinned = BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir, weight_reader="pinned")
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert order[:2] == ["read", "modeling import"] and order.count("read") == 1
    lib = BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir)
    a, b = lib.model.state_dict(), pinned.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert order.count("read") == 1                                  # the library's loader reads no ahead


def test_a_fifo_weight_file_is_refused_before_the_read_ahead(tiny_vl3_dir, tmp_path, monkeypatch):
    import os
    import shutil

    import models.weight_reader as wr
    from models.videollama3 import BudgetedVideoLlama3

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_vl3_dir, ckpt)
    (ckpt / "model.safetensors").unlink()
    os.mkfifo(ckpt / "model.safetensors")
    started = []
    monkeypatch.setattr(wr, "ReadAhead", lambda *a, **kw: started.append(1))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        BudgetedVideoLlama3.from_pretrained(ckpt, weight_reader="pinned")
    assert started == []
