"""Safetensors files read straight into device memory by several threads (issue 41, the weight load of the first
answer; ``model.init_args.weight_reader: pinned``).

transformers' loader reads each tensor from the memory-mapped file into a CPU tensor and copies that to the GPU
(``core_model_loading._materialize_copy``: ``tensor[...]`` then ``.to(device)``, four threads): a pageable copy per
tensor, and Python per tensor under the GIL, which the CLI's set-up and the decode loader's start hold in the same
seconds (H100: 4.2 s alone for the 7B checkpoint, 5.3-6.6 s in the CLI, the raw read 3.4 s). Here each file's tensor
bytes go to one device buffer: threads read chunks of the file (``readinto``, the GIL released) into page-locked
staging buffers, two per thread, and copy each to the device on the thread's own CUDA stream while the other is
filled. The tensors are views of that buffer, byte for byte the file's; transformers then loads them as a
``state_dict`` (its key mapping and checks unchanged).

Format (huggingface/safetensors@ead9d7baeb72df3b1f9d3c049ab3e513b422b0a8:README.md, "Format"): "8 bytes: N, an
unsigned little-endian 64-bit integer, containing the size of the header"; "N bytes: a JSON UTF-8 string
representing the header" (``{name: {"dtype", "shape", "data_offsets": [BEGIN, END]}}``, offsets relative to the
data, and "A special key ``__metadata__``"); "Rest of the file: byte-buffer", which "needs to be entirely indexed";
"Endianness: Little-endian", "Order: 'C' or row-major". The dtype names are its ``Dtype`` enum's.
"""
from __future__ import annotations

import json
import struct
import threading
from pathlib import Path

import torch

from algorithms.errors import CheckpointError

# safetensors' dtype names (its ``Dtype`` enum) -> torch
DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
CHUNK_BYTES = 64 << 20      # one staging buffer; each thread holds two (page-locked on CUDA)
THREADS = 4


def read_header(path: Path) -> tuple[int, dict]:
    """``(data_start, tensors)`` of one safetensors file: where its data begins (bytes) and its tensor entries
    ``{name: (dtype, shape, begin, end)}`` (offsets relative to ``data_start``).

    Raises:
        CheckpointError: a header that is cut short, not JSON, names an unknown dtype, or whose offsets do not fit
            the file or the shape (the file and tensor named).
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: a safetensors file cannot be read (shorter than its 8-byte header length; "
                                  "truncated? copy the checkpoint again)")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise CheckpointError(f"{path}: a safetensors file cannot be read (header of {n} bytes past the end of "
                                  f"the {size}-byte file; truncated? copy the checkpoint again)")
        try:
            meta = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: a safetensors file cannot be read (its header is not JSON: {e})") from e
    out, data = {}, size - 8 - n
    for name, entry in meta.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name} has dtype {entry.get('dtype')!r}, which this reader does "
                                  f"not know (known: {', '.join(DTYPES)}); use model.init_args.weight_reader=library")
        begin, end = (int(x) for x in entry["data_offsets"])
        shape = tuple(int(x) for x in entry["shape"])
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= begin <= end <= data or end - begin != numel * dtype.itemsize:
            raise CheckpointError(f"{path}: tensor {name}'s bytes [{begin}, {end}) do not fit the file's {data} data "
                                  f"bytes or its shape {list(shape)} ({entry.get('dtype')}); truncated or corrupted? "
                                  "copy the checkpoint again")
        out[name] = (dtype, shape, begin, end)
    return 8 + n, out


def read_safetensors(files: list[Path], device: torch.device | str, threads: int = THREADS,
                     chunk_bytes: int = CHUNK_BYTES) -> dict[str, torch.Tensor]:
    """Every tensor of ``files`` on ``device``, the bytes as in the files (see the module docstring).

    Args:
        files: safetensors files (their tensor names must not repeat across files).
        device: where the tensors go (CUDA: through page-locked staging buffers; the CPU: read straight into the
            destination, for tests).
        threads: reader threads (each with two staging buffers of ``chunk_bytes``).

    Returns:
        ``{name: tensor}`` with each file's dtypes and shapes; a tensor is a view of its file's device buffer (a copy
        where its offset is not a multiple of its element size).

    Raises:
        CheckpointError: a header :func:`read_header` refuses, a name in two files, or a file that ends before its
            data does (the file named).
    """
    device = torch.device(device)
    jobs, views = [], {}
    for path in files:
        path = Path(path)
        start, entries = read_header(path)
        size = max((e[3] for e in entries.values()), default=0)
        buf = torch.empty(size, dtype=torch.uint8, device=device)
        jobs += [(path, start + off, buf, off, min(chunk_bytes, size - off)) for off in range(0, size, chunk_bytes)]
        for name, (dtype, shape, begin, end) in entries.items():
            if name in views:
                raise CheckpointError(f"{path}: tensor {name} is also in another file of the checkpoint")
            views[name] = (buf, dtype, shape, begin, end)
    failures: list[BaseException] = []
    lock = threading.Lock()
    pending = list(reversed(jobs))

    def work() -> None:
        cuda = device.type == "cuda"
        size = max(job[4] for job in jobs)            # (no staging buffer larger than the largest chunk)
        staging = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(2)] if cuda else None
        done = [None, None]
        stream = torch.cuda.Stream(device) if cuda else None
        handles: dict[Path, object] = {}
        k = 0
        try:
            while not failures:
                with lock:
                    if not pending:
                        break
                    path, at, buf, off, n = pending.pop()
                h = handles.get(path) or handles.setdefault(path, open(path, "rb", buffering=0))
                h.seek(at)
                if cuda:
                    if done[k] is not None:
                        done[k].synchronize()           # the copy from this staging buffer has ended
                    target = staging[k][:n]
                else:
                    target = buf[off:off + n]
                view, got = memoryview(target.numpy()), 0
                while got < n:
                    r = h.readinto(view[got:])
                    if not r:
                        raise CheckpointError(f"{path}: a safetensors file cannot be read (it ends {n - got} bytes "
                                              "before its data does; truncated? copy the checkpoint again)")
                    got += r
                if cuda:
                    with torch.cuda.stream(stream):
                        buf[off:off + n].copy_(target, non_blocking=True)
                        done[k] = torch.cuda.Event()
                        done[k].record(stream)
                    k ^= 1
            if stream is not None:
                stream.synchronize()
        except BaseException as e:  # noqa: BLE001 - raised again in the calling thread
            failures.append(e)
        finally:
            for h in handles.values():
                h.close()

    workers = [threading.Thread(target=work, name=f"weight-reader-{i}", daemon=True)
               for i in range(min(max(1, threads), len(jobs)))]   # none for files without data
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if failures:
        raise failures[0]
    out = {}
    for name, (buf, dtype, shape, begin, end) in views.items():
        raw = buf[begin:end]
        if begin % dtype.itemsize:
            raw = raw.clone()
        out[name] = raw.view(dtype).view(shape) if end > begin else torch.empty(shape, dtype=dtype, device=device)
    return out


class ReadAhead:
    """:func:`read_safetensors` of ``files`` onto ``device`` started now, in a thread of its own, for a caller that has
    other work first (``BudgetedVideoLlama3.from_pretrained``: transformers' modeling imports and the model's
    construction, seconds of Python under the GIL, while these reads mostly wait on the disk and the copy engine with
    it released). :meth:`result` waits for it.

    Raises (from :meth:`result`): whatever :func:`read_safetensors` raised, in the calling thread.
    """

    def __init__(self, files: list[Path], device: torch.device | str, threads: int = THREADS):
        self._state: dict[str, torch.Tensor] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, args=(list(files), device, threads),
                                        name="weight-read-ahead", daemon=True)
        self._thread.start()

    def _read(self, files, device, threads) -> None:
        try:
            self._state = read_safetensors(files, device, threads)
        except BaseException as e:  # noqa: BLE001 - raised again in the thread that asks for the result
            self._error = e

    def result(self) -> dict[str, torch.Tensor]:
        """The ``{name: tensor}`` of :func:`read_safetensors` (once: the reader keeps no reference after)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        state, self._state = self._state, None
        if state is None:
            raise RuntimeError("ReadAhead.result() was already taken")
        return state


def checkpoint_files(path: Path) -> list[Path]:
    """The weight files of a transformers checkpoint directory: those its ``model.safetensors.index.json`` maps to,
    else ``model.safetensors``.

    Raises:
        FileNotFoundError: neither is there, or a file the index names is missing (named).
    """
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
    else:
        files = [path / "model.safetensors"]
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"{f}: a weights file of the checkpoint is missing")
    return files
