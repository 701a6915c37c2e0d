"""The VideoLLaMA3 checkpoint's weight files read onto the GPU beside the CLI's imports (issue 41, first answer).

With ``weight_reader: pinned`` (``auto`` on CUDA) :meth:`BudgetedVideoLlama3.from_pretrained` starts its reads
(:class:`models.weight_reader.ReadAhead`) when the module is built, ~7.4 s after the process start on the H100
(session 14: the imports of torch, Lightning and its ``torch._dynamo`` / sympy come first), and the load ends 3.7 s
later. :func:`start_weights_early`, called by ``evaluate.py`` right after the CUDA context is started, reads the
same files to the same device seconds sooner, while those imports run (the reads release the GIL): it finds the
checkpoint from the command line as LightningCLI will (``configs/predict/demo.yaml`` unless ``--config`` files are
given, later files and then ``--model.init_args.model_path`` / ``weight_reader`` overriding) and starts only for the
VideoLLaMA3 module (``lightning_modules.budgeted_qa.BudgetedQA``) with the pinned reader on CUDA. The load then
takes that read (:func:`take`), when its files are the ones it would read itself, byte for byte the same tensors;
any other read started here is dropped first (its device memory freed before the load), so a guess that missed
costs the reads, never a different weight. ``TOKENBUDGET_EARLY_WEIGHTS=0`` turns it off.

Imports: the standard library, PyYAML, torch and :mod:`models.weight_reader` (nothing of transformers or Lightning).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

ENV_SWITCH = "TOKENBUDGET_EARLY_WEIGHTS"   # "0": the reads start at the model's load, as before
VL3_MODULE = "lightning_modules.budgeted_qa.BudgetedQA"
MODEL_KEYS = ("model_path", "weight_reader")

_LOCK = threading.Lock()
_EARLY: dict = {}          # "files", "device", "ahead", "start" (perf_counter) while a read started here is held
_MARKS: dict[str, float] = {}   # "weights_early_start" once the load took that read


def _cli_values(argv: list[str], default_config: Path) -> dict | None:
    """``class_path``, ``model_path`` and ``weight_reader`` of the ``model`` block as LightningCLI will see them
    (``default_config``, then each ``--config`` file in order, then ``--model.init_args.<key>`` / ``--model.class_path``
    arguments), or ``None`` where the command line replaces the model in a way not followed here (``--model FILE``,
    ``--model.init_args FILE``), asks for help or config printing, or puts the run on the CPU
    (``--trainer.accelerator cpu``)."""
    import yaml

    configs, overrides = [], {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("-h", "--help", "--print_config") or name in ("--model", "--model.init_args"):
            return None
        if name == "--trainer.accelerator" and (value if eq else argv[i + 1] if i + 1 < len(argv) else "") == "cpu":
            return None      # (the load's device is then the CPU)
        takes = name == "--config" or name in ("--model.class_path", *(f"--model.init_args.{k}" for k in MODEL_KEYS),
                                               *(f"--model.{k}" for k in MODEL_KEYS))
        if takes and not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        if name == "--config":
            configs.append(Path(value))
        elif takes:
            overrides[name.rsplit(".", 1)[-1]] = value
        i += 1
    values: dict = {}
    for cfg in [default_config, *configs]:
        model = (yaml.safe_load(cfg.read_text()) or {}).get("model")
        if isinstance(model, dict):
            if "class_path" in model:
                if model["class_path"] != values.get("class_path"):
                    values = {}         # another class: its init_args start over
                values["class_path"] = model["class_path"]
            args = model.get("init_args") or {}
            values.update({k: args[k] for k in MODEL_KEYS if k in args})
    values.update(overrides)
    return values


def _device():
    """This process's GPU (:func:`models.device_start.rank_gpu`), ``None`` without CUDA."""
    import torch

    from models.device_start import rank_gpu

    if not torch.cuda.is_available():
        return None
    return torch.device("cuda", rank_gpu())


def start_weights_early(argv: list[str], default_config: Path) -> threading.Thread | None:
    """Start reading the VideoLLaMA3 checkpoint of this ``predict`` command line to this process's GPU
    (``LOCAL_RANK``'s, else 0, as :mod:`models.device_start`) in a daemon thread, when the machine has an NVIDIA
    device, ``TOKENBUDGET_EARLY_WEIGHTS`` is not ``0``, the model is :data:`VL3_MODULE` with ``weight_reader``
    ``auto`` or ``pinned`` and its ``model_path`` holds a checkpoint in this project's layout (``config.json`` with a
    ``text_config``) and its safetensors files. Anything else (no such model, a config that cannot be read here, no
    CUDA device) starts nothing and raises nothing: the load then reads as before and reports its own errors.

    Returns:
        The started thread, or ``None``.
    """
    from models.device_start import predict_on_nvidia_machine

    if not predict_on_nvidia_machine(argv, ENV_SWITCH):
        return None
    try:
        values = _cli_values(argv[1:], default_config)
        if not values or values.get("class_path") != VL3_MODULE or \
                str(values.get("weight_reader", "auto")) not in ("auto", "pinned") or not values.get("model_path"):
            return None
        path = Path(str(values["model_path"]))
        import json

        cfg = path / "config.json"
        if not cfg.is_file() or "text_config" not in json.loads(cfg.read_text()):
            return None
        from models.weight_reader import checkpoint_files

        files = [f.resolve() for f in checkpoint_files(path)]
    except Exception:  # noqa: BLE001 - the load reads as before and says what is wrong
        return None

    def run() -> None:
        from models.loading import reading_checkpoint
        from models.weight_reader import ReadAhead

        try:
            device = _device()
            if device is None:
                return
            with reading_checkpoint(path):   # (its file checks first: a FIFO is never opened)
                with _LOCK:
                    _EARLY.update(files=files, device=device, start=time.perf_counter(),
                                  ahead=ReadAhead(files, device))
        except Exception:  # noqa: BLE001 - the load reads as before and reports it
            return

    thread = threading.Thread(target=run, name="weights-early", daemon=True)
    thread.start()
    _EARLY["thread"] = thread
    return thread


def take(files: list[Path], device) -> "tuple[object, float] | None":
    """The read :func:`start_weights_early` started, with its start (``time.perf_counter()``), when it reads exactly
    ``files`` (resolved) to ``device``; ``None`` otherwise. Either way nothing started here is held after this call:
    a read of other files or to another device is waited for and dropped (its device memory freed before the
    caller's own read)."""
    import torch

    thread = _EARLY.pop("thread", None)
    if thread is not None:
        thread.join()
    with _LOCK:
        early, held = dict(_EARLY), bool(_EARLY)
        _EARLY.clear()
    if not held:
        return None
    want = [Path(f).resolve() for f in files]
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if early["files"] == want and early["device"] == device:
        _MARKS["weights_early_start"] = early["start"]
        return early["ahead"], early["start"]
    try:
        early["ahead"].result()   # (waited for, then dropped: its tensors freed here)
    except Exception:  # noqa: BLE001 - the caller's own read reports what is wrong
        pass
    del early
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return None


def early_weight_marks() -> dict[str, float]:
    """``weights_early_start`` (a ``time.perf_counter()`` value, for the caller's timeline) when the load took a
    read :func:`start_weights_early` started; ``{}`` otherwise."""
    return dict(_MARKS)
