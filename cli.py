"""The project's LightningCLI: the builder both entry points use, the console quieting, and the one-line handling
of user errors (a bad file, folder or setting).

``evaluate.py`` (``predict``) and ``train.py`` (``fit`` / ``validate`` / ``test``) are thin entry points over
:func:`build_cli` and :func:`main`; neither imports the other. :class:`TrainCLI` adds the training run folder's
CSV logger and the W&B run id / group of a checkpoint's run; :func:`check_checkpoint_file` fails closed on an
unreadable ``--ckpt_path``.
"""
from __future__ import annotations

import errno
import logging
import re
import sys
import warnings
from pathlib import Path
from typing import Any

# torchmetrics' optional extras that a run never uses but that its import would load eagerly (issue 41); transformers:
# ``torchmetrics.functional.text.bert`` imports ``AutoModel`` / ``AutoTokenizer`` (about 0.4 s before the module is
# built); the model's own imports of transformers come later and are not affected
TORCHMETRICS_HIDDEN_EXTRAS = ("matplotlib", "scienceplots", "scipy", "torchvision", "transformers")


def import_torchmetrics_lean(hidden: tuple[str, ...] = TORCHMETRICS_HIDDEN_EXTRAS) -> None:
    """Import torchmetrics with its optional extras ``hidden`` reported as not installed, before Lightning does.

    Lightning reads torchmetrics' version at import (``lightning.fabric.utilities.imports``:
    ``compare_version("torchmetrics", ...)`` imports the package), and torchmetrics' ``__init__`` imports all of
    ``torchmetrics.functional``: through its image metrics torchvision, whose ``ops`` import ``torch._dynamo`` and
    so sympy; through its plotting utilities matplotlib; and scipy where installed (``python -X importtime -c
    "import cli"``: torchmetrics 7.8 s of 12.7 s on the 2-core CPU machine, sympy 0.7 s, matplotlib 0.26 s). While
    torchmetrics is imported, ``lightning_utilities``' availability checks (``RequirementCache``, which torchmetrics'
    ``*_AVAILABLE`` flags are, and ``package_available``) answer ``False`` for ``hidden``; afterwards they answer
    normally. What is lost: torchmetrics' own ``.plot()`` methods, its torchvision / scipy based metrics (image
    quality, some audio and clustering metrics) and its transformers-based text metrics (BERTScore, InfoLM) in this
    process; the project uses none of them (its plots call matplotlib directly, ``callbacks/scoring/plots.py``; the
    turn head's AUROC / AP need neither). The compile stack (``torch._dynamo``, sympy) stays on the import path:
    Lightning imports it itself (``lightning.fabric.wrappers`` imports ``torch._dynamo``: 1.2 s of ``import cli`` on
    the CPU machine, sympy 1.5 s of 7.0 s on the H100 of 2026-12-06). A no-op when torchmetrics is already
    imported."""
    import sys

    if "torchmetrics" in sys.modules:
        return
    from lightning_utilities.core import imports as lu

    real_check, real_available = lu.RequirementCache._check_available, lu.package_available

    def check(self) -> None:
        name = (self.requirement or self.module or "").split(".")[0]
        for op in "<>=!~[; ":
            name = name.split(op)[0]
        if name in hidden and not hasattr(self, "available"):
            self.available, self.message = False, f"{name!r} hidden while torchmetrics is imported (cli.py)"
            return
        real_check(self)

    def available(package_name: str) -> bool:
        return False if package_name.split(".")[0] in hidden else real_available(package_name)

    lu.RequirementCache._check_available, lu.package_available = check, available
    try:
        import torchmetrics  # noqa: F401
    finally:
        lu.RequirementCache._check_available, lu.package_available = real_check, real_available


import_torchmetrics_lean()

from lightning.pytorch import LightningDataModule, LightningModule, Trainer  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from algorithms.errors import CheckpointError, SettingError  # noqa: E402
from callbacks.run_folder import RunFolderCSVLogger, discard_failed_run, run_info_of, run_paths  # noqa: E402

# records are keyed by the benchmark's qid, never by batch index, so Lightning's batch-index inference is not needed
warnings.filterwarnings("ignore", message="Couldn't infer the batch indices")
warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)")
# a resumed run whose questions are all answered has nothing left to load: expected, the table is still printed
warnings.filterwarnings("ignore", message=".*Total length of .* across ranks is zero")
# the extractor moves only what its step needs to the device, on purpose
warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device` in `LightningModule`")


# where the compiled kernels are kept between runs (issue 41); TOKENBUDGET_INDUCTOR_CACHE=torch: PyTorch's default
INDUCTOR_CACHE_DEFAULT = Path("~/.cache/tokenbudget/inductor")


def use_persistent_compile_cache() -> str | None:
    """Point PyTorch Inductor's on-disk caches (FX graph, AOTAutograd, the Triton kernels it builds under
    ``<dir>/triton``) at a directory that outlives the process and ``/tmp`` clean-ups, so a second run's early
    compilation (:mod:`models.videollama3.warm`) loads the kernels instead of compiling them.

    ``TORCHINDUCTOR_CACHE_DIR``, when set, is kept as it is. Otherwise ``TOKENBUDGET_INDUCTOR_CACHE`` decides:
    unset -> :data:`INDUCTOR_CACHE_DEFAULT` (``~/.cache/tokenbudget/inductor``), ``torch`` -> PyTorch's own
    default (``/tmp/torchinductor_<user>``, nothing set), any other value -> that directory. Set before anything
    compiles (Inductor reads the variable when it first needs its cache).

    Returns:
        The directory now in ``TORCHINDUCTOR_CACHE_DIR``, or ``None`` for PyTorch's default.
    """
    import os

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"]
    choice = os.environ.get("TOKENBUDGET_INDUCTOR_CACHE", "")
    if choice == "torch":
        return None
    path = str(Path(choice or INDUCTOR_CACHE_DEFAULT).expanduser())
    if not os.path.isabs(path):   # no home directory to expand "~" to: PyTorch's own default, not a relative path
        return None
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


def compile_kernels_in_process() -> int:
    """Inductor compiles (and, with a warm cache, loads) its Triton kernels in this process rather than through its
    pool of compile processes: ``torch._inductor.config.compile_threads = 1``, unless ``TORCHINDUCTOR_COMPILE_THREADS``
    is set (Inductor read it at import; kept as it is). The generated code and kernels are the same either way.

    Why: the early compilation (:mod:`models.videollama3.warm`) is the critical path of the first answer, and with the
    pool (``min(32, CPUs)`` processes per rank, each importing torch) it took longer: 14.0 s against 11.9 s beside the
    weight load with a warm cache, 22.4 s against 20.3 s cold (H200, 2026-12-03/04, ``bench/load_probe.py``
    ``device_map_compile`` / ``device_map_compile_threads1`` and ``bench/cli_throughput.py``), and a node of 8 ranks
    would start up to 8 x 32 compile processes beside the decode workers.

    Returns:
        The compile-thread count now in effect.
    """
    import os

    import torch._inductor.config as inductor_config

    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        inductor_config.compile_threads = 1
    return int(inductor_config.compile_threads)


def build_cli(args: list[str] | None, run: bool, **kwargs) -> LightningCLI:
    """The project's LightningCLI (subclass mode for model and data, seed 0); ``kwargs`` add entry-specific options
    (config callback, default config files). Shared by ``evaluate.py`` and ``train.py``. Sets the compile cache
    directory first (:func:`use_persistent_compile_cache`) and keeps Inductor's compiles in this process
    (:func:`compile_kernels_in_process`)."""
    use_persistent_compile_cache()
    compile_kernels_in_process()
    kwargs.setdefault("save_config_callback", None)
    cli_class = kwargs.pop("cli_class", ProjectCLI)
    if run:   # only the parser of the subcommand the command line names is built (see ProjectCLI.subcommands)
        import sys

        argv = sys.argv[1:] if args is None else args
        if argv and argv[0] in LightningCLI.subcommands():
            kwargs.setdefault("only_subcommand", argv[0])
    # a bad option or value prints the error after a one-line usage, not the ~60-line list of every option
    # (argparse's usage on error); ``--help`` still lists them all
    parser_kwargs = kwargs.setdefault("parser_kwargs", {})
    # no abbreviated options: argparse would take ``--trainer.max_epoch`` for ``--trainer.max_epochs`` (and a prefix
    # shared by two keys would change meaning when a key is added); the main parser and every subcommand's
    parser_kwargs.setdefault("allow_abbrev", False)
    for sub in ("fit", "validate", "test", "predict"):
        sub_kwargs = parser_kwargs.setdefault(sub, {})
        sub_kwargs.setdefault("usage", "%(prog)s [-c CONFIG] [--section.key VALUE ...]  (--help lists every option)")
        sub_kwargs.setdefault("allow_abbrev", False)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # "Loading weights" bars would interleave with the run's own progress bar
    quiet_console()
    return cli_class(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                     args=args, run=run, seed_everything_default=0, **kwargs)


_NOT_ACCEPTED = re.compile(r"Option '([^']+)' is not accepted")
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)'")
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)"')
MAX_ERROR_LINE = 200


def _init_arg_names(class_path: str) -> list[str]:
    """The keyword arguments ``class_path``'s class accepts (its ``__init__`` and its bases' when it passes
    ``**kwargs`` on), or ``[]`` when it cannot be imported."""
    import importlib
    import inspect

    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return []
    names: list[str] = []
    for klass in getattr(cls, "__mro__", [cls]):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names += [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                  and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def simplify_cli_error(message: str) -> str:
    """A jsonargparse error as a user should read it.

    * An unknown key of a class given by ``class_path`` (jsonargparse's multi-line "Does not validate against any
      of the Union subtypes ... Option 'budget' is not accepted ... Given value: ...") becomes one line: ``model.
      init_args.budget: BudgetedQA has no setting 'budget'; did you mean 'budgets'?`` (closest names by
      :func:`difflib.get_close_matches`, else the list of its settings).
    * A bad value of one such key becomes ``model.init_args.max_new_tokens: Expected a int. Got value: lots
      (BudgetedQA)``.
    * Any other message keeps its lines without the ``Given value:`` dumps (a YAML section's whole init_args), each
      line cut to ``MAX_ERROR_LINE`` characters.
    """
    import difflib

    bad, cls = _NOT_ACCEPTED.search(message), _CLASS_PATH.search(message)
    if bad and cls:
        key = _PARSER_KEY.search(message)
        names = _init_arg_names(cls.group(1))
        where = f"{key.group(1)}.init_args.{bad.group(1)}" if key else bad.group(1)
        close = difflib.get_close_matches(bad.group(1), names, n=3, cutoff=0.6)
        if close:   # only the names about as close as the best (num_worker: num_workers, not also in_order)
            ratio = [difflib.SequenceMatcher(None, bad.group(1), c).ratio() for c in close]
            close = [c for c, r in zip(close, ratio) if r >= ratio[0] - 0.1]
        short = cls.group(1).rpartition(".")[2]
        if close:
            hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
        else:
            hint = f"its settings: {', '.join(names)}" if names else f"see --help for {cls.group(1)}"
        return f"{where}: {short} has no setting {bad.group(1)!r}; {hint}"
    nested = re.search(r"Problem with given class_path '([^']+)':\s*\n\s*Parser key \"([^\"]+)\":\s*\n\s*(.+)", message)
    if nested:                                   # a bad value of one init arg: that key and jsonargparse's reason
        key = _PARSER_KEY.search(message)
        where = f"{key.group(1)}.init_args.{nested.group(2)}" if key else nested.group(2)
        reason = nested.group(3).strip()
        if reason.startswith("Does not validate against any of the Union subtypes"):   # e.g. an Optional[int]
            block = message[nested.end(3):]
            given = re.search(r"Given value: (.*)", block)
            block = block[:given.start()] if given else block
            kinds = list(dict.fromkeys(re.findall(r"Expected a <class '([^']+)'>", block)))
            reason = f"expected {' or '.join(kinds) or 'another type'}" + (f", got {given.group(1)}" if given else "")
        reason = re.sub(r"<class '([^']+)'>", r"\1", reason)
        return f"{where}: {reason[:MAX_ERROR_LINE]} ({nested.group(1).rpartition('.')[2]})"
    lines = [ln for ln in message.splitlines() if not ln.strip().startswith(("Given value:", "Given value type:"))]
    return "\n".join(ln if len(ln) <= MAX_ERROR_LINE else ln[:MAX_ERROR_LINE] + " ..." for ln in lines)


class ProjectArgumentParser(LightningArgumentParser):
    """LightningCLI's parser whose final error message is :func:`simplify_cli_error`'s (errors raised inside a
    nested parse, which jsonargparse combines, are left as they are)."""

    def error(self, message: str, ex: Exception | None = None):
        if self.exit_on_error:
            message = self._with_close_options(simplify_cli_error(message))
        return super().error(message, ex)

    def _with_close_options(self, message: str) -> str:
        """``unrecognized arguments: --trainer.max_epoch 1`` with the closest options of this parser appended
        (``; did you mean '--trainer.max_epochs'?``): abbreviations are refused (``allow_abbrev=False``), so a
        shortened or mistyped key lands here."""
        import difflib

        if not message.startswith("unrecognized arguments:"):
            return message
        options = [o for o in getattr(self, "_option_string_actions", {}) if o.startswith("--")]
        close = []
        for arg in message.split(":", 1)[1].split():
            if arg.startswith("--"):
                close += [c for c in difflib.get_close_matches(arg.split("=", 1)[0], options, n=1, cutoff=0.8)
                          if c not in close]
        return message + ("; did you mean " + " or ".join(repr(c) for c in close) + "?" if close else "")


DEFAULT_PRECISIONS = (None, 32, "32", "32-true")


class ProjectCLI(LightningCLI):
    """The project's LightningCLI: :class:`ProjectArgumentParser` for the main and subcommand parsers, and
    ``trainer.precision`` refused for ``predict`` (the prediction modules load their model in their own
    ``dtype``, so Lightning's precision setting would be silently ignored; ``model.init_args.dtype`` is the one that
    is applied and recorded in the output folder's ``run.json``)."""

    def __init__(self, *args: Any, only_subcommand: str | None = None, **kwargs: Any):
        self._only_subcommand = only_subcommand
        kwargs.setdefault("parser_class", ProjectArgumentParser)
        only = {only_subcommand} if only_subcommand else set()
        if only and isinstance(kwargs.get("parser_kwargs"), dict):   # the other subcommands' parser settings
            kwargs["parser_kwargs"] = {k: v for k, v in kwargs["parser_kwargs"].items()
                                       if k not in LightningCLI.subcommands() or k in only}
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        """Lightning's subcommands, or only ``only_subcommand`` (:func:`build_cli`: the one the command line
        starts with). LightningCLI builds one parser per subcommand, each resolving the Trainer's, the model's and
        the data module's signatures (~0.2 s of the four on the 2-core CPU machine); a command line that names
        its subcommand parses only that one's, so the others are not built. Its parsing, defaults, errors and
        ``--help`` are that subcommand parser's, as before; a command line without a subcommand first (``--help``,
        a typo) gets every subcommand."""
        every = LightningCLI.subcommands()
        only = getattr(self, "_only_subcommand", None)
        return {only: every[only]} if only in every else every

    def before_instantiate_classes(self) -> None:
        cfg = self.config.get(self.subcommand) if self.subcommand else None
        if self.subcommand != "predict" or cfg is None:
            return
        precision = (cfg.get("trainer") or {}).get("precision")
        if precision not in DEFAULT_PRECISIONS:
            raise SettingError(
                f"--trainer.precision={precision} is not applied by predict: the model runs in "
                "model.init_args.dtype (recorded in run.json); set --model.init_args.dtype=bfloat16 (or float16) "
                "instead and leave trainer.precision unset")


class _DropAdvert(logging.Filter):
    """Drops Lightning's "💡 Tip: ... litlogger" line (an advertisement printed into every run's console)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("💡 Tip")


class _LineOfItsOwn(logging.Handler):
    """Logging's last-resort handler (the one the project's module loggers reach: message only, WARNING and up, to
    stderr) printing through ``tqdm.write``, which clears a progress bar drawn on the terminal, prints the line and
    draws the bar again: a bad video's one line starts a line of its own instead of being glued after the bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - as logging's own handlers: a failed console line never ends the run
            self.handleError(record)


def quiet_console() -> None:
    """Keep the console to the run's own output: no Lightning advert line, no FFmpeg ``[h264 @ 0x…]`` lines
    from decord (a failed frame is reported by the decoder's error message, which names the file and the cause),
    and the project's warning lines each on a line of its own beside the progress bar (:class:`_LineOfItsOwn`)."""
    if not isinstance(logging.lastResort, _LineOfItsOwn):
        logging.lastResort = _LineOfItsOwn(logging.WARNING)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropAdvert) for f in rank_zero.filters):
        rank_zero.addFilter(_DropAdvert())
    try:
        import decord

        decord.logging.set_level(decord.logging.QUIET)
    except Exception:  # noqa: BLE001 - decord missing or without its logging module: nothing to quiet
        pass


def evaluation_line(subcommand: str, folder: Path) -> str:
    """The line a ``validate`` / ``test`` ends with: its run folder and the files it holds of ``metrics.csv`` and
    ``run_info.json`` (only those written: ``run_info.json`` is a fit's)."""
    names = [n for n in ("metrics.csv", "run_info.json") if (folder / n).is_file()]
    return f"{subcommand} results: {folder}" + (f" ({', '.join(names)})" if names else "")


class TrainCLI(ProjectCLI):
    """LightningCLI that adds :class:`RunFolderCSVLogger` beside the configured loggers and, for a checkpoint of a
    run folder, resumes (``fit``) or joins (``test`` / ``validate``) that run's W&B id / group."""

    def before_instantiate_classes(self) -> None:
        cfg = self.config.get(self.subcommand) if self.subcommand else None
        if cfg is None:
            return
        info = run_info_of(cfg.get("ckpt_path"))
        logger = cfg.get("trainer", {}).get("logger") if info else None
        if not info or not hasattr(logger, "class_path") or not str(logger.class_path).endswith("WandbLogger"):
            return
        args = logger.init_args
        if self.subcommand == "fit":
            if args.get("version") is None and args.get("id") is None:
                args["version"] = info["id"]
            if args.get("group") is None:
                args["group"] = info.get("group")
        else:
            if args.get("group") is None:
                args["group"] = info.get("group") or info["id"]
            args["job_type"] = self.subcommand
            if args.get("name") is None:
                args["name"] = f"{info.get('name') or info['id']}-{self.subcommand}"

    def _run_subcommand(self, subcommand: str) -> None:
        """Check the data before the run starts (so missing or mismatching features stop it before a W&B run or a run
        folder exists), then run; a run that fails before its first training step leaves no W&B run and no run
        folder (:func:`callbacks.run_folder.discard_failed_run`)."""
        setup = getattr(self.datamodule, "setup", None)
        if subcommand in ("fit", "validate", "test") and callable(setup):
            setup(subcommand)          # TurnFeatureDataModule: reads and checks every file once (idempotent)
        created = [d for d in run_paths(self.trainer) if not d.exists()]
        try:
            with warnings.catch_warnings():
                if subcommand in ("validate", "test"):
                    # the evaluation writes to a run folder of its own, not the fit's checkpoint folder, so
                    # Lightning's ModelCheckpoint says it will not reload the fit's best-model bookkeeping: expected
                    warnings.filterwarnings("ignore", message="The dirpath has changed from")
                super()._run_subcommand(subcommand)
        except BaseException:
            discard_failed_run(self.trainer, created)
            raise
        if subcommand in ("validate", "test") and self.trainer.is_global_zero:
            folders = run_paths(self.trainer)[2::4]   # save_dir/project/<run id> of each W&B logger
            if folders:   # the metrics of this evaluation: a run folder of its own, beside the fit's
                print(evaluation_line(subcommand, Path(folders[0])), flush=True)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        if not any(isinstance(lg, CSVLogger) for lg in trainer.loggers):
            follow = trainer.loggers[0] if trainer.loggers else None
            trainer.loggers = [*trainer.loggers, RunFolderCSVLogger(trainer.default_root_dir, follow)]
        return trainer


def ckpt_path_arg(args: list[str]) -> str | None:
    """The ``--ckpt_path`` value on the command line ``args`` (``--ckpt_path=X`` or ``--ckpt_path X``), or None."""
    for i, a in enumerate(args):
        if a.startswith("--ckpt_path="):
            return a.split("=", 1)[1]
        if a == "--ckpt_path" and i + 1 < len(args):
            return args[i + 1]
    return None


def check_checkpoint_file(path: str | None) -> None:
    """Fail with a one-line error naming ``path`` when it is a file but not a readable checkpoint archive (Lightning
    checkpoints are zip archives; a truncated copy loses the zip's central directory, which torch reports as
    "PytorchStreamReader failed reading zip archive" without the file). A missing file is left to Lightning.

    Raises:
        CheckpointError: naming the file.
    """
    import zipfile

    if not path or not Path(path).is_file():   # "best" / "last" / a missing file: Lightning's own errors
        return
    try:
        with zipfile.ZipFile(path):
            pass
    except (zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"--ckpt_path={path}: not a readable checkpoint (truncated or not a .ckpt written by "
                              f"train.py fit; {type(e).__name__}: {e})") from e


USER_ERROR_TYPES = ("SettingError", "BaselineRunError", "FeatureFileError", "OutputSettingsError", "OutputLockedError",
                    "OutputWriteError", "AnnotationError", "MediaMissingError", "EasyComFormatError", "DecodeError", "CheckpointError",
                    "DecodeWorkerDied", "MisconfigurationException")   # Lightning's own: conflicting trainer settings
USER_OS_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
# an OSError of these kinds is the machine's state, not a bug: a full disk or quota, a read-only file system
USER_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def user_error(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s chain that a user should read instead of a traceback, or None.

    A user error is a bad setting, file or folder: one of the project's input-error types (``USER_ERROR_TYPES``:
    ``SettingError`` for configuration values, the data-format errors) or a missing / unreadable path
    (``USER_OS_ERRORS``), a full disk or read-only output (``OutputWriteError``, and any ``OSError`` of
    ``USER_ERRNOS`` that names its file). Everything else (a ``ValueError`` of an internal check, a library error,
    a full-disk ``OSError`` that names no file) keeps its traceback.
    LightningCLI/jsonargparse wrap errors raised while building the model or data, so the chain (``__cause__``,
    and ``__context__`` unless suppressed) is followed; the outermost match wins, so a project error that wraps a
    ``FileNotFoundError`` is the one shown.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ in USER_ERROR_TYPES or isinstance(exc, USER_OS_ERRORS):
            return exc
        if isinstance(exc, OSError) and exc.errno in USER_ERRNOS and exc.filename:
            return exc
        exc = exc.__cause__ if (exc.__cause__ is not None or exc.__suppress_context__) else exc.__context__
    return None


class OtherProcessStopped(RuntimeError):
    """A process of a multi-process (DDP) run lost its peers: another process stopped first (a user error or a dead
    decode worker, said in that process's own line), and the collective this one was in failed."""


# the words torch.distributed's gloo transport uses when a peer process is gone
_PEER_GONE = ("Connection closed by peer", "remote worker crashing")


def peer_stopped(exc: BaseException) -> OtherProcessStopped | None:
    """An :class:`OtherProcessStopped` when ``exc`` or its chain is a collective that failed because another process
    of the run ended (the transport's words for a peer that is gone, :data:`_PEER_GONE`), else ``None``: that process
    prints its own error, so this one says it in one line instead of a second traceback. Any other distributed error
    (a timeout, a misconfigured backend) keeps its traceback."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, RuntimeError) and any(w in str(exc) for w in _PEER_GONE):
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            return OtherProcessStopped(f"another process of this run stopped first (its error is printed above; "
                                       f"here {type(exc).__name__}: {first}); the records written before are safe, "
                                       "and the same command resumes")
        exc = exc.__cause__ or exc.__context__
    return None


INTERRUPTED_STATUS = 130   # the shell's status of a command stopped by SIGINT (128 + 2)
TERMINATED_STATUS = 143    # ... and by SIGTERM (128 + 15): what a scheduler or ``docker stop`` sends
NOTHING_ANSWERED_STATUS = 1   # a run that ended with every record an error record (every video unreadable...)


class Terminated(KeyboardInterrupt):
    """SIGTERM received (:func:`stop_on_sigterm`). A ``KeyboardInterrupt``, so the run stops exactly as on Ctrl-C:
    Lightning's graceful shutdown (``on_exception`` of every callback: the writer notes what it kept), a DataLoader
    worker ends quietly (torch's worker loop ignores a ``KeyboardInterrupt``), then :func:`main` exits 143."""


_TERMINATING = False


def _raise_terminated(signum, frame) -> None:
    """The SIGTERM handler: raise :class:`Terminated` in the main thread, once (a second SIGTERM during the
    shutdown the first one started is ignored, as Lightning ignores a second Ctrl-C)."""
    global _TERMINATING
    if _TERMINATING:
        return
    _TERMINATING = True
    raise Terminated(f"signal {signum} (SIGTERM)")


def stop_on_sigterm():
    """Make SIGTERM stop the run as Ctrl-C does (issue 44 item 5); returns the handler it replaced, or ``None``
    when nothing was installed (not the main thread, or a handler other than the default is already set).

    Lightning's own SIGTERM handler (``trainer/connectors/signal_connector.py``) only logs "Received SIGTERM" and
    sets ``trainer.received_sigterm``, which the predict loop never reads, so a run went on through every video
    and the scoring. Lightning composes its handler with one already installed (``_HandlersCompose``: its
    notifier, then this one), and restores this one at teardown, so this handler runs inside a trainer too."""
    import signal
    import threading

    global _TERMINATING
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        return None
    _TERMINATING = False
    signal.signal(signal.SIGTERM, _raise_terminated)
    import logging

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if _not_a_keyboard_interrupt not in logger.filters:
            logger.addFilter(_not_a_keyboard_interrupt)
    return previous


def _not_a_keyboard_interrupt(record) -> bool:
    """A logging filter: Lightning's "Detected KeyboardInterrupt, attempting graceful shutdown" (its handler of the
    ``KeyboardInterrupt`` that :class:`Terminated` is) is left out after a SIGTERM, whose own line says what
    happened; kept after a Ctrl-C."""
    return not (_TERMINATING and "Detected KeyboardInterrupt" in str(record.msg))


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` ends a run the user interrupted (Ctrl-C or SIGTERM): a ``KeyboardInterrupt`` (:class:`
    Terminated` included), or the ``SystemExit(1)`` Lightning raises after its own graceful shutdown of one
    (``lightning.pytorch.trainer.call._call_and_handle_interrupt`` calls ``sys.exit(1)`` inside its ``except
    KeyboardInterrupt``, so the interrupt is that exit's ``__context__``)."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, SystemExit) and isinstance(exc.__context__, KeyboardInterrupt)


def terminated(exc: BaseException) -> bool:
    """Whether ``exc`` (an :func:`interrupted` one) ends a run stopped by SIGTERM (:class:`Terminated`)."""
    return isinstance(exc, Terminated) or isinstance(exc, SystemExit) and isinstance(exc.__context__, Terminated)


def main(cli_main) -> None:
    """Run an entry point's ``cli_main()``; a user error (bad file, folder or setting) prints one line naming it
    and exits with status 2 instead of a traceback (``TOKENBUDGET_TRACEBACK=1`` shows the traceback). An interrupted
    run (Ctrl-C) exits with status 130 after the writer's note, "N records kept in <dir>; run the same command to
    resume" (:func:`callbacks.run_log.note_interrupt`; just "interrupted" when no predict writer was set up); a run
    stopped by SIGTERM (:func:`stop_on_sigterm`) the same way with status 143, its lines starting "terminated". A
    run that ended with every record of its folder an error record exits with status 1 after its table and report,
    its last line "error: nothing was answered: ..." (:func:`callbacks.run_log.note_nothing_answered`)."""
    import os
    import signal
    import sys

    from callbacks.run_log import take_interrupt_notes, take_nothing_answered

    previous = stop_on_sigterm()
    take_nothing_answered()   # (a line kept by an earlier run in this process does not end this one)
    try:
        cli_main()
        failed = take_nothing_answered()
        if failed:   # every record an error: the run finished, but a script running it must see that it failed
            print("\n" + "\n".join(f"error: {n}" for n in failed), file=sys.stderr, flush=True)
            sys.exit(NOTHING_ANSWERED_STATUS)
    except (KeyboardInterrupt, SystemExit) as e:
        if not interrupted(e):
            raise
        notes = take_interrupt_notes()
        word = "terminated (SIGTERM)" if terminated(e) else "interrupted"
        print("\n" + ("\n".join(f"{word}: {n}" for n in notes) or word), file=sys.stderr, flush=True)
        sys.exit(TERMINATED_STATUS if terminated(e) else INTERRUPTED_STATUS)
    except Exception as e:  # noqa: BLE001 - re-raised unless it is a user error
        err = user_error(e)
        if err is None and "datamodules.video_items" in sys.modules:   # a decode worker died while the loader waited
            from datamodules.video_items import DecodeWorkerDied, worker_death_message

            died = worker_death_message(e)
            err = DecodeWorkerDied(died) if died is not None else None
        if err is None:   # a DDP process whose peer stopped: that one names the cause
            err = peer_stopped(e)
        if err is None or os.environ.get("TOKENBUDGET_TRACEBACK"):
            raise
        # on a line of its own: a progress bar may have left the cursor at the end of its line
        hint = ""
        if type(err) is OSError and err.errno in USER_ERRNOS:   # a write no project code named: what to do
            hint = "; free space (or raise the quota)" if err.errno != errno.EROFS else \
                "; the file system is read-only: choose an output folder on a writable one"
        print(f"\nerror: {type(err).__name__}: {err}{hint}\n(set TOKENBUDGET_TRACEBACK=1 for the full traceback)",
              file=sys.stderr)
        sys.exit(2)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
