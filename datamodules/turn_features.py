"""``TurnFeatureDataModule``: cached causal features (one file per session and mode) + turn-taking targets.

Files: ``<features_dir>/<session>.<mode>.safetensors`` (``datamodules.features``); only files whose name carries
``expected_mode`` are read, and each must agree with the run (fail closed, file named, before any training step):
meta ``mode == expected_mode``, ``memory_s``, ``memory_policy`` (absent: ``window``), ``fps``, ``output_hz``,
``session`` (== file name) and ``layer`` (``expected_layer``, negative counting from the end as in the extraction
config, resolved with the file's ``num_layers``; when ``None``, every file of the run must share one layer,
recorded in ``self.layer``), plus one hidden size D across files. Missing sessions of a split are an error, and
so is an empty split that the stage reads (``setup``: fit reads train + val, validate val, test test; with
``standardize`` every stage needs train sessions).

Targets come from utterances (``algorithms.turn_targets``), loaded by ``utterances_loader`` (dotted path of a
``fn(root, session) -> list[utterance]``; default EasyCom's ``datamodules.easycom.load_session_utterances``, imported
lazily), and are cached per session in memory for the process (keyed by loader, root, session, rows, wearer and
target settings). A session without utterances is an error, and so is a ``wearer_id`` that speaks in no session
(a wrong ``utterances_root`` or ``wearer_id`` would otherwise train on all-negative targets); sessions where the
wearer never speaks get a warning.

Split by EasyCom session number (the last integer in the session name): train 1-3, 5-9; val 4, 12; test 10, 11.
Everything is held in memory. Batches (dict):
    states      float (B, L, D)   standardized with train-split statistics (non-initialization rows) if enabled
    targets     float (B, L, 10)  ``algorithms.turn_targets.target_names()`` order
    mask        bool  (B, L, 10)  rows/targets that count (padding, warm-up, unknown future, excluded init rows off)
    shift       long  (B, L)      1 shift, 0 hold, -1 no event (or row not counted)
    row_valid   bool  (B, L)      rows that count
Training items are chunks of ``chunk_rows`` rows, each preceded by up to ``warmup_rows`` earlier rows that give
causal heads their context but carry no loss; validation/test items are whole sessions (batch size 1).

``initialization_rows`` decides whether rows flagged by ``initialization_mask`` (zeros: no state yet, e.g. before
the first completed block of ``completed-block-hold``, or inside an EasyCom reset gap) count in losses and metrics:
``"keep"`` (default) counts every row; ``"exclude"`` drops this mode's flagged rows (the sensitivity analysis; the
evaluated rows then differ between modes); ``"exclude_any_mode"`` drops rows flagged in *any* of the three modes'
files of the session (their ``initialization_mask`` is read, nothing else; a missing file is an error), so all
modes are trained and scored on identical rows and gap rows never count as silence.
"""
from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from algorithms.errors import SettingError, check_int
from algorithms.streaming import DEFAULT_MEMORY_POLICY, check_memory_policy
from algorithms.turn_targets import build_turn_targets, flat_targets
from datamodules.features import (FeatureFileError, check_meta, error_path, feature_path, load_features,
                                 nonfinite_rows, parse_feature_name)

_TARGET_CACHE: dict[tuple, tuple[Any, list[int]]] = {}   # -> (turn targets, the session's participant ids)
ALL_MODES = ("open-stream-replay", "completed-block-hold", "micro-chunk-200ms")
# the choices as types, so ``train.py --help`` lists them and a typo fails when the command line is parsed
StreamingMode = Literal["open-stream-replay", "completed-block-hold", "micro-chunk-200ms"]   # = ALL_MODES
MemoryPolicy = Literal["window", "sliding"]                        # = algorithms.streaming.MEMORY_POLICIES
InitializationRows = Literal["keep", "exclude", "exclude_any_mode"]   # = INIT_ROW_POLICIES
INIT_ROW_POLICIES = ("keep", "exclude", "exclude_any_mode")
STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}  # splits each stage reads


@dataclass
class JsonUtterance:
    """Utterance read from a ``<session>.utterances.json`` file (seconds on the session timeline)."""

    start_s: float
    end_s: float
    participant_id: int
    text: str = ""
    target_of_speech: Any = None


def load_utterances_json(root: str | Path, session: str) -> list[JsonUtterance]:
    """Read ``<root>/<session>.utterances.json`` (a list of utterance dicts, as written by ``synthetic_turns``).

    Raises:
        FileNotFoundError: ``root`` or the file is missing (named).
        FeatureFileError: not valid JSON, not a list, an utterance without ``start_s``/``end_s``/``participant_id``
            or one that ends before it starts (file and utterance index named).
    """
    path = Path(root) / f"{session}.utterances.json"
    if not Path(root).is_dir():
        raise FileNotFoundError(f"{root}: utterances_root folder missing")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: utterances file of {session} missing")
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FeatureFileError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(items, list):
        raise FeatureFileError(f"{path}: expected a list of utterances, got {type(items).__name__}")
    out = []
    for k, d in enumerate(items):
        try:
            u = JsonUtterance(float(d["start_s"]), float(d["end_s"]), int(d["participant_id"]), d.get("text", ""),
                              d.get("target_of_speech"))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise FeatureFileError(f"{path}: utterance {k} lacks start_s/end_s/participant_id ({e!r})") from e
        if u.end_s < u.start_s:
            raise FeatureFileError(f"{path}: utterance {k} ends before it starts (start_s {u.start_s}, "
                                   f"end_s {u.end_s})")
        out.append(u)
    return out


def _import(path: str) -> Callable:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def session_number(session: str) -> int:
    """EasyCom session number: the last integer in the name (``Session_4`` -> 4).

    Raises:
        ValueError: the name has no digits.
    """
    nums = re.findall(r"\d+", session)
    if not nums:
        raise ValueError(f"session name {session!r} has no session number")
    return int(nums[-1])


@dataclass
class SessionData:
    """One session in memory: T rows, D hidden."""

    session: str
    path: Path
    states: torch.Tensor  # (T, D) float32
    targets: torch.Tensor  # (T, 10)
    mask: torch.Tensor  # (T, 10) bool
    shift: torch.Tensor  # (T,) long
    row_valid: torch.Tensor  # (T,) bool
    initialization_mask: torch.Tensor  # (T,) bool


class TurnRows(Dataset):
    """Items are row ranges ``[a, b)`` of sessions; rows before ``loss_from`` carry no loss (warm-up context)."""

    def __init__(self, sessions: list[SessionData], spans: list[tuple[int, int, int, int]]):
        self.sessions, self.spans = sessions, spans  # (session index, a, loss_from, b)

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        k, a, loss_from, b = self.spans[idx]
        s = self.sessions[k]
        row_valid = s.row_valid[a:b].clone()
        row_valid[: loss_from - a] = False
        return {"states": s.states[a:b], "targets": s.targets[a:b], "mask": s.mask[a:b] & row_valid[:, None],
                "shift": torch.where(row_valid, s.shift[a:b], -1), "row_valid": row_valid}


def collate_rows(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad items to the longest L (padding rows: zero states, mask False, shift -1)."""
    L = max(it["states"].shape[0] for it in items)
    out = {}
    for key, fill in (("states", 0.0), ("targets", 0.0), ("mask", False), ("shift", -1), ("row_valid", False)):
        xs = [it[key] for it in items]
        buf = torch.full((len(xs), L, *xs[0].shape[1:]), fill, dtype=xs[0].dtype)
        for i, x in enumerate(xs):
            buf[i, : x.shape[0]] = x
        out[key] = buf
    return out


class TurnFeatureDataModule(LightningDataModule):
    """Cached causal features + turn targets for one streaming mode (module docstring has the details).

    Args:
        features_dir: folder with ``<session>.<mode>.safetensors`` files.
        expected_mode: the streaming mode this run trains on; files of other modes are never read.
        utterances_root: root passed to ``utterances_loader`` (EasyCom root, or a folder of utterance JSONs).
        utterances_loader: dotted path of ``fn(root, session) -> list[utterance]``.
        expected_memory_s / expected_fps / expected_output_hz / expected_layer: run settings every file must match.
        expected_memory_policy: the extraction memory policy every file must have (``window`` | ``sliding``; a file
            without the field counts as ``window``).
        expected_audio_left_context: the extraction's log-mel left context every file must have (``True``: the
            causal past-audio padding of today's extractor; ``False``: files made before it, or with
            ``audio_left_context: false``; a file without the field counts as ``False``; ``None``: not checked).
        train_sessions / val_sessions / test_sessions: EasyCom session numbers per split.
        wearer_id: Participant_ID of the glasses wearer.
        initialization_rows: ``keep | exclude | exclude_any_mode`` (module docstring).
        chunk_rows / warmup_rows: training chunk length and causal warm-up rows (rows; 5 rows = 1 s).
        standardize: z-score features with the train split's per-dimension mean/std.
        target_kwargs: extra ``build_turn_targets`` settings (``min_silence_s``, ``pre_cond_s``, ...).
    """

    def __init__(self, features_dir: str, expected_mode: StreamingMode, utterances_root: str,
                 utterances_loader: str = "datamodules.easycom.load_session_utterances",
                 expected_memory_s: float = 8.0, expected_fps: float = 2.0, expected_output_hz: float = 5.0,
                 expected_layer: int | None = None, expected_memory_policy: MemoryPolicy = DEFAULT_MEMORY_POLICY,
                 train_sessions: Sequence[int] = (1, 2, 3, 5, 6, 7, 8, 9), val_sessions: Sequence[int] = (4, 12),
                 test_sessions: Sequence[int] = (10, 11), wearer_id: int = 2,
                 initialization_rows: InitializationRows = "keep", chunk_rows: int = 100, warmup_rows: int = 10,
                 batch_size: int = 16, standardize: bool = True, num_workers: int = 0,
                 target_kwargs: dict[str, float] | None = None, expected_audio_left_context: bool | None = True):
        super().__init__()
        check_memory_policy(expected_memory_policy, "expected_memory_policy")
        for name, value, low in (("chunk_rows", chunk_rows, 1), ("warmup_rows", warmup_rows, 0),
                                 ("batch_size", batch_size, 1), ("num_workers", num_workers, 0),
                                 ("wearer_id", wearer_id, 0)):
            check_int(f"data.init_args.{name}", value, low)
        if initialization_rows not in INIT_ROW_POLICIES:
            raise ValueError(f"initialization_rows={initialization_rows!r}; expected one of {INIT_ROW_POLICIES}")
        self.save_hyperparameters()
        self.splits = {"train": list(train_sessions), "val": list(val_sessions), "test": list(test_sessions)}
        self.data: dict[str, list[SessionData]] | None = None
        self.feature_dim: int | None = None
        self.layer: int | None = None

    # ---------------------------------------------------------------- loading
    def _files(self) -> dict[int, tuple[str, Path]]:
        hp = self.hparams
        root = Path(hp.features_dir)
        if not root.is_dir():
            raise FeatureFileError(f"{root}: features_dir does not exist")
        found, other_modes = {}, set()
        for path in sorted(root.glob("*.safetensors")):
            session, mode, policy = parse_feature_name(path.name)
            if (mode, policy) != (hp.expected_mode, hp.expected_memory_policy):
                other_modes.add(mode if policy == "window" else f"{mode} ({policy})")
                continue
            n = session_number(session)
            if n in found:
                raise FeatureFileError(f"{path}: session number {n} also in {found[n][1]}")
            found[n] = (session, path)
        if not found:
            raise FeatureFileError(f"{root}: no feature files for expected_mode={hp.expected_mode!r}, "
                                   f"expected_memory_policy={hp.expected_memory_policy!r} "
                                   f"(modes present: {sorted(other_modes)})")
        return found

    def _audio_expectation(self) -> dict:
        v = self.hparams.get("expected_audio_left_context", True)
        return {} if v is None else {"audio_left_context": bool(v)}

    def load(self) -> dict[str, list[SessionData]]:
        """Read and check every file of every split, build targets; idempotent.

        Raises:
            FeatureFileError: a file disagrees with the run (mode, memory, memory policy, fps, output rate, layer,
                session, D), a split's session has no file, a split has no row that counts, or ``standardize``
                has fewer than 2 train rows.
            SettingError: ``standardize`` with no train session, a session without utterances, or ``wearer_id``
                absent from every session's utterances.
        """
        if self.data is not None:
            return self.data
        hp = self.hparams
        self.check_splits(None)
        files = self._files()
        expected = {"mode": hp.expected_mode, "memory_s": hp.expected_memory_s,
                    "memory_policy": hp.expected_memory_policy, "fps": hp.expected_fps,
                    "output_hz": hp.expected_output_hz, **self._audio_expectation()}
        loader = None
        loaded: dict[int, tuple[Path, dict, dict]] = {}
        for split, nums in self.splits.items():
            missing = [n for n in nums if n not in files]
            if missing:
                failed = [e.name for e in (error_path(feature_path(hp.features_dir, f"Session_{n}", hp.expected_mode,
                                                                   hp.expected_memory_policy)) for n in missing)
                          if e.is_file()]
                raise FeatureFileError(f"{hp.features_dir}: no {hp.expected_mode} file for {split} sessions {missing}"
                                       + (f" (their extraction failed: see {', '.join(failed)})" if failed else ""))
        for n in sorted({n for nums in self.splits.values() for n in nums}):
            session, path = files[n]
            tensors, meta = load_features(path)  # whole check pass before any target or training work
            bad = nonfinite_rows(tensors["states"])
            if bad:
                raise FeatureFileError(f"{path}: {bad} rows of states are NaN or infinite (re-extract the session)")
            if error_path(path).is_file():
                import warnings

                warnings.warn(f"{path}: a later extraction of {session} failed (see {error_path(path).name}); "
                              "training on the features of the earlier run", stacklevel=2)
            want = {**expected, "session": session}
            if hp.expected_layer is not None:
                # a negative layer counts from the end, as the extractor's ``layer`` argument; files record the
                # resolved index and the thinker's depth (``num_layers``: hidden states 0..num_layers)
                want["layer"] = hp.expected_layer
                if hp.expected_layer < 0 and isinstance(meta.get("num_layers"), int):
                    want["layer"] = meta["num_layers"] + 1 + hp.expected_layer
                elif hp.expected_layer < 0 and isinstance(meta.get("layer"), int) and meta["layer"] >= 0:
                    raise FeatureFileError(
                        f"{path}: expected_layer={hp.expected_layer} counts from the end, but this file records layer "
                        f"{meta['layer']} without num_layers (written before that field existed): set expected_layer "
                        f"to the resolved index or null")
            check_meta(path, meta, want)
            if self.layer is None:
                self.layer, first = meta["layer"], path
            elif meta["layer"] != self.layer:
                raise FeatureFileError(f"{path}: layer {meta['layer']!r} differs from {first} (layer {self.layer!r})")
            D = tensors["states"].shape[1]
            if self.feature_dim is None:
                self.feature_dim = D
            elif D != self.feature_dim:
                raise FeatureFileError(f"{path}: hidden size {D} differs from {self.feature_dim}")
            loaded[n] = (path, tensors, meta)
        by_num: dict[int, SessionData] = {}
        participants: dict[str, list[int]] = {}
        for n, (path, tensors, meta) in loaded.items():
            session = meta["session"]
            T = tensors["states"].shape[0]
            key = (hp.utterances_loader, str(hp.utterances_root), session, T, hp.wearer_id,
                   tuple(sorted((hp.target_kwargs or {}).items())))
            if key not in _TARGET_CACHE:
                loader = loader or _import(hp.utterances_loader)
                utts = loader(hp.utterances_root, session)
                ids = self._check_utterances(utts, session)
                _TARGET_CACHE[key] = (build_turn_targets(utts, T, wearer_id=hp.wearer_id,
                                                         **(hp.target_kwargs or {})), ids)
            tt, participants[session] = _TARGET_CACHE[key]
            init = tensors["initialization_mask"].bool()
            row_valid = torch.ones(T, dtype=torch.bool)
            if hp.initialization_rows == "exclude":
                row_valid = ~init
            elif hp.initialization_rows == "exclude_any_mode":
                row_valid = ~(init | self._other_modes_init(session, T))
            targets, mask = flat_targets(tt, row_valid)
            shift = torch.where(row_valid, tt.shift, -1)
            by_num[n] = SessionData(session, path, tensors["states"].float(), targets, mask, shift, row_valid, init)
        self._check_wearer(participants)
        data = {split: [by_num[n] for n in nums] for split, nums in self.splits.items()}
        for split, sessions in data.items():
            if sessions and not any(bool(s.mask.any()) for s in sessions):
                raise FeatureFileError(
                    f"{hp.features_dir}: the {split} split (sessions {[s.session for s in sessions]}) has no row that "
                    f"counts (every row is an initialization or excluded row, initialization_rows="
                    f"{hp.initialization_rows!r}); give it longer sessions")
        if hp.standardize:
            rows = torch.cat([s.states[~s.initialization_mask] for s in data["train"]])
            if rows.shape[0] < 2:
                raise FeatureFileError(
                    f"{hp.features_dir}: standardize needs at least 2 train rows outside initialization, the train "
                    f"split (sessions {[s.session for s in data['train']]}) has {rows.shape[0]}")
            mean, std = rows.mean(0), rows.std(0).clamp(min=1e-6)
            for s in by_num.values():
                s.states = (s.states - mean) / std
        self.data = data
        return self.data

    def _other_modes_init(self, session: str, T: int) -> torch.Tensor:
        """OR of ``initialization_mask`` over the other modes' files of ``session``: bool (T,).

        Raises:
            FeatureFileError: a file is missing, unreadable or has a different row count.
        """
        out = torch.zeros(T, dtype=torch.bool)
        for mode in ALL_MODES:
            if mode == self.hparams.expected_mode:
                continue
            hp = self.hparams
            path = feature_path(hp.features_dir, session, mode, hp.expected_memory_policy)
            try:
                tensors, meta = load_features(path)
                mask = tensors["initialization_mask"].bool()
            except Exception as e:
                failed = error_path(path)
                why = f"; its extraction failed: see {failed.name}" if failed.is_file() else ""
                raise FeatureFileError(f"{path}: initialization_rows='exclude_any_mode' needs this file ({e}{why})") \
                    from e
            check_meta(path, meta, {"mode": mode, "memory_s": hp.expected_memory_s,
                                    "memory_policy": hp.expected_memory_policy, "fps": hp.expected_fps,
                                    "output_hz": hp.expected_output_hz, "session": session,
                                    **self._audio_expectation()})
            if mask.shape != (T,):
                raise FeatureFileError(f"{path}: {mask.shape[0]} rows, the {self.hparams.expected_mode} file has {T}")
            out |= mask
        return out

    def check_splits(self, stage: str | None) -> None:
        """Fail closed on an empty split that ``stage`` (``fit | validate | test``; ``None``: none) reads, or on an
        empty train split when ``standardize`` needs its statistics (every stage).

        Raises:
            SettingError: naming the empty ``<split>_sessions`` setting.
        """
        stage = getattr(stage, "value", stage)   # Lightning passes its TrainerFn (a str enum)
        for split in STAGE_SPLITS.get(stage, ()):
            if not self.splits[split]:
                raise SettingError(f"data.init_args.{split}_sessions is empty: {stage} needs at least one {split} "
                                   "session")
        if self.hparams.standardize and not self.splits["train"]:
            raise SettingError("data.init_args.train_sessions is empty: standardize takes the feature mean/std from "
                               "the train sessions (in every stage)")

    def _check_utterances(self, utts: Sequence[Any], session: str) -> list[int]:
        """The session's participant ids; a session without utterances (a wrong ``utterances_root``, an empty
        transcript) would train on all-negative targets: refused, naming it.

        Raises:
            SettingError: no utterance.
        """
        hp = self.hparams
        if not utts:
            raise SettingError(f"{hp.utterances_root}: {session} has no utterances (read by {hp.utterances_loader}); "
                               "check data.init_args.utterances_root")
        return sorted({int(u.participant_id) for u in utts})

    def _check_wearer(self, participants: dict[str, list[int]]) -> None:
        """``wearer_id`` must speak somewhere in the run (a wrong id gives all-negative wearer targets everywhere):
        refused when it occurs in no session; a warning names the sessions where it never speaks (possible in a
        short session, so not an error).

        Raises:
            SettingError: ``wearer_id`` in no session's utterances (the ids per session listed).
        """
        wearer = self.hparams.wearer_id
        silent = sorted(s for s, ids in participants.items() if wearer not in ids)
        if silent and len(silent) == len(participants):
            raise SettingError(f"data.init_args.wearer_id={wearer} never occurs in the utterances (participant ids: "
                               + ", ".join(f"{s} {participants[s]}" for s in silent) + ")")
        if silent:
            import warnings

            warnings.warn(f"data.init_args.wearer_id={wearer} never speaks in {silent}: their wearer targets are "
                          "all negative", stacklevel=2)

    def setup(self, stage: str | None = None) -> None:
        self.check_splits(stage)
        self.load()

    # ---------------------------------------------------------------- loaders
    def _train_spans(self) -> list[tuple[int, int, int, int]]:
        hp, spans = self.hparams, []
        for k, s in enumerate(self.data["train"]):
            T = s.states.shape[0]
            for start in range(0, T, hp.chunk_rows):
                spans.append((k, max(0, start - hp.warmup_rows), start, min(T, start + hp.chunk_rows)))
        return spans

    def train_dataloader(self) -> DataLoader:
        ds = TurnRows(self.load()["train"], self._train_spans())
        return DataLoader(ds, batch_size=self.hparams.batch_size, shuffle=True, collate_fn=collate_rows,
                          num_workers=self.hparams.num_workers)

    def _eval_loader(self, split: str) -> DataLoader:
        sessions = self.load()[split]
        ds = TurnRows(sessions, [(k, 0, 0, s.states.shape[0]) for k, s in enumerate(sessions)])
        return DataLoader(ds, batch_size=1, shuffle=False, collate_fn=collate_rows, num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")
