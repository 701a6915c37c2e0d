"""BudgetedQA: thin LightningModule around :class:`models.videollama3.BudgetedVideoLlama3`.

``predict_step`` takes one video (all its questions) and returns one record per (question, budget) still to do;
the prediction writer appends them to jsonl.

What becomes an error record, and what stops the run (:func:`run_or_error_records`):

=====================================================  ============================================================
raised for one video                                   result
=====================================================  ============================================================
decode failure (the data module's ``item["error"]``)    that video's error records
``torch.cuda.OutOfMemoryError``                         that video's error records, after its memory is released
a question longer than the model's context             that question's error records (:class:`ContextLengthError`)
a question its loader could not make askable           that question's error records (``Question.error``: a
(``Question.error``)                                   WorldSense row with 1 or more than 10 options)
any other ``Exception`` of an input-dependent check     that video's error records ``"<video path>: <type>: <cause>"``
(``ValueError`` such as transformers' ``smart_resize``  the run goes on, a rerun retries them
"absolute aspect ratio must be smaller than 200",
``RuntimeError``, ``OSError``, ``ArithmeticError``...)  (one console line; the traceback in the output folder's
                                                       ``errors_rank<r>.log``, :mod:`callbacks.run_log`)
a programming error (``PROGRAMMING_ERRORS``:            :class:`VideoStepError` naming the video, the run stops; the
``AssertionError``, ``TypeError``, ``NameError``,       records of the videos before it are already on disk (written
``AttributeError``, ``ImportError``, ``KeyError``,      and fsynced per video by the writer)
``IndexError``, ``NotImplementedError``,
``RecursionError``) or a CUDA error
(``torch.AcceleratorError``: the CUDA context is
lost for every later video too)
a decode worker's death, which torch raises in the      :class:`DecodeWorkerDied` naming the video the worker was
main process while it answers another video             decoding; no record for the video in hand; the run stops
                                                        (a rerun decodes that video in a process of its own)
=====================================================  ============================================================

The line between the two is drawn by exception class: the library and our own input checks raise ``ValueError`` /
``RuntimeError`` (bad shapes, aspect ratios, lengths) for a bad input; a wrong name, attribute, type, index or
assertion is a bug in our code, which would fail every video the same way, so it stops the run instead of writing a
benchmark full of error records.
"""
from __future__ import annotations

import functools
import gc
import logging
import time
from pathlib import Path

import torch
from lightning.pytorch import LightningModule

from algorithms.errors import SettingError, check_dtype
from datamodules.video_items import DecodeWorkerDied, worker_death_message
from callbacks.process_clock import age_at, process_age_s
from callbacks.run_log import TRACEBACKS, traceback_file
from datamodules.benchmarks import Question, question_sha1
from datamodules.decode import EncoderSizing
from datamodules.benchmarks.prompts import (chat_parts, recorded_template, check_template, interleaved_subtitles, pre_media_text,
                                            prompt_and_template, resolve_template)
from models.loading import check_attn_implementation
from models.videollama3 import BudgetedVideoLlama3, EncodeCache, prepare_budgets
from models.videollama3 import warm
from models.kernels import KERNEL_MODES, Fusable
from models.kernels import set_mode as set_kernel_mode
from models.videollama3.frame_sizes import LazyVideoProcessor

log = logging.getLogger(__name__)

DECODE_MODES = ("auto", "dynamic", "static", "graph")
FIRST_STEP_MODES = ("wait", "eager")
WEIGHT_READERS = ("auto", "library", "pinned")   # model.init_args.weight_reader (BudgetedVideoLlama3.from_pretrained)


def _done(value):
    """A ``finish()`` for work already done: returns ``value``."""
    return lambda: value


def _graphs_compiled() -> int:
    """Graphs ``torch.compile`` has made in this process so far (``torch._dynamo`` counters)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


def job_name(budget: int, variant: str | None = None) -> str:
    """Output folder / job key: ``b<B>`` or ``<variant>_b<B>``."""
    return f"b{budget}" if variant is None else f"{variant}_b{budget}"


def error_record(item: dict, qid: str, answer: str, meta: dict, job: str, budget: int | None, message: str,
                 variant: str | None = None) -> dict:
    """The error record of one (question, job): the fields that key and score it, and ``error`` (the cause)."""
    return {"qid": qid, "video": item["video_id"], "benchmark": item["benchmark"], "job": job, "budget": budget,
            "variant": variant, "answer": answer, "meta": meta, "error": message}


def error_records(item: dict, jobs: dict[str, int], message: str) -> list[dict]:
    """One error record per (question, job) still to do on a video."""
    return [error_record(item, q["qid"], q["answer"], q["meta"], job, jobs[job], message)
            for q in item["questions"] for job in item["jobs"].get(q["qid"], [])]


def split_question_errors(item: dict) -> tuple[dict, list[dict]]:
    """``(item without the questions a loader marked with an error, those questions)``: a question the loader could
    not make askable (``Question.error``, e.g. a WorldSense row with 1 or more than 10 options) gets error records,
    the video's other questions are answered."""
    bad = [q for q in item["questions"] if q.get("error")]
    if not bad:
        return item, []
    return {**item, "questions": [q for q in item["questions"] if not q.get("error")]}, bad


def qa_record(item: dict, q: Question, answer, stats: dict, n_frames_used: int, job: str, budget: int | None,
              variant: str | None, template: str) -> dict:
    """One jsonl record of DESIGN §3.8 for an answered question (both parsers' predictions included).

    Args:
        item: the datamodule's video item (``video_id``, ``benchmark``, ``video_info``).
        answer: a :class:`models.videollama3.Answer`.
        stats: the plan's :meth:`~algorithms.budget.Plan.stats` (or a layout's, with the same keys).
        n_frames_used: frames the job used (``capped`` when fewer than the video's 1 fps frames).

    An answer with ``error`` set (the question's prompt did not fit the model's context) gives that question's
    error record instead, naming the video file and the question.

    ``video_info.fps`` / ``fps_ok`` are seed 001's per budget (:func:`algorithms.budget.budget_fps`:
    ``fps = min(bd.FPS, len(idx) / max(info["duration"], 1e-6))``, ``fps_ok=fps >= bd.MIN_FPS - 1e-6``); the
    container's rate is ``native_fps`` (``native_fps_ok``: the container gave a usable rate).
    """
    from algorithms.budget import budget_fps
    from algorithms.choice import official_rule, parse, parse_robust

    if getattr(answer, "error", None):
        return error_record(item, q.qid, q.answer, q.meta, job, budget,
                            f"{item.get('video_path', item['video_id'])}: question {q.qid}: {answer.error}", variant)

    info = item["video_info"]
    fps, fps_ok = budget_fps(n_frames_used, info["duration_s"])  # seed 001's per-budget fps / fps_ok
    video_info = {"duration_s": info["duration_s"], "native_hw": info["native_hw"], "n_frames": n_frames_used,
                  "fps": fps, "fps_ok": fps_ok, "native_fps": info["fps"], "native_fps_ok": info["fps_ok"],
                  "sample_fps": info["sample_fps"],
                  "decode_hw": info["decode_hw"], "vfr": info["vfr"],
                  # the reader that decoded the video (decord / pyav_skip / pyav / nvdec) and why not NVDEC;
                  # concealment_checked: False where NVDEC's frames went unchecked (issue 42 item 1)
                  # decoded_isolated: in a process of its own, having killed a decode worker in an earlier run
                  **{k: info[k] for k in ("decoder", "decoder_fallback", "timestamps_unusable", "frames_concealed",
                                          "concealment_checked", "decoded_isolated") if k in info},
                  "capped": n_frames_used < round(info["duration_s"]) or info["sample_fps"] < 1.0 or
                  n_frames_used < info["n_frames"]}
    return {
        "qid": q.qid, "video": item["video_id"], "benchmark": item["benchmark"], "job": job, "budget": budget,
        "variant": variant, "answer": q.answer,
        "pred": parse(answer.text, q.options, official_rule(item["benchmark"])), "pred_rule": official_rule(item["benchmark"]),
        "pred_robust": parse_robust(answer.text, q.options), "options": list(q.options),
        "question_sha1": question_sha1(q.question),   # a resumed run compares it (datamodules.videoqa.annotation_changes)
        "response": answer.text, "seq_len": answer.seq_len, "prefix_fallback": answer.fallback,
        "meta": {**q.meta, "template": template,
                 **({"frames_replaced": info["frames_replaced"]} if info.get("frames_replaced") else {})},
        "mode": stats["mode"], "hw": stats["hw"], "raw_hw": stats["raw_hw"], "n_groups": stats["n_groups"],
        "n_compressed": stats["n_compressed"], "n_raw_frames": stats["n_raw_frames"],
        "vision_tokens": stats["vision_tokens"], "seg_lens": stats["seg_lens"], "video_info": video_info,
    }


# exceptions that mean a bug in our code (or a lost CUDA context), not a bad video: they stop the run
PROGRAMMING_ERRORS = (AssertionError, TypeError, NameError, AttributeError, ImportError, KeyError, IndexError,
                      NotImplementedError, RecursionError, getattr(torch, "AcceleratorError", ()))


class VideoStepError(RuntimeError):
    """A programming error (``PROGRAMMING_ERRORS``) raised while answering one video; names the video. The run
    stops on it; the records written before it are safe (the writer fsyncs each video's records)."""


def _cause(e: BaseException) -> str:
    """``<type>: <first line of the message>`` (at most 300 characters)."""
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:300]}"


def run_or_error_records(item: dict, run, make_errors) -> list[dict]:
    """``run()`` for one video, with every failure of that video turned into ``make_errors(message)`` (the module
    docstring's table): ``message`` names the video file and the cause.

    A CUDA out-of-memory first releases the failed step's memory (``gc`` + ``empty_cache``), so the next video runs.

    Raises:
        VideoStepError: ``run()`` raised one of ``PROGRAMMING_ERRORS`` (the original is its ``__cause__``).
        DecodeWorkerDied: torch reported a dead DataLoader worker while ``run()`` ran (its SIGCHLD handler raises
            in the main process, whatever video that is answering): named with the video the worker was decoding.
    """
    path = item.get("video_path", item.get("video_id"))
    try:
        return run()
    except torch.cuda.OutOfMemoryError as e:
        msg = f"{path}: CUDA out of memory ({str(e).splitlines()[0][:160]})"
        log.warning(msg)
        del e
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return make_errors(msg)
    except PROGRAMMING_ERRORS as e:
        raise VideoStepError(f"{path}: {_cause(e)} (a bug, not a bad input: the run stops here; the records "
                             "written before this video are safe, a rerun resumes at it)") from e
    except Exception as e:  # noqa: BLE001 - an input-dependent failure of this video only
        died = worker_death_message(e, path)
        if died is not None:   # torch's SIGCHLD handler raised it here: not this video's failure (no error records)
            raise DecodeWorkerDied(died) from e
        msg = f"{path}: {_cause(e)}"
        where = traceback_file()
        if where is None:   # no run folder (the module used without the writer): the traceback on the console
            log.warning("video failed, recorded as an error: %s", msg, exc_info=True)
        else:               # one console line; the traceback in <out_dir>/errors_rank<r>.log
            log.warning("video failed, recorded as an error: %s (traceback in %s)", msg, where)
            TRACEBACKS.warning("video failed, recorded as an error: %s", msg, exc_info=True)
        del e
        gc.collect()   # the failed step's tensors (held by the traceback's frames) go now
        return make_errors(msg)


class BudgetedQA(LightningModule):
    """Budgeted multiple-choice QA with VideoLLaMA3.

    Args:
        model_path: local checkpoint directory (transformers VideoLLaMA3 + ``qbase/``).
        budgets: vision-token budgets B evaluated for every video from one decode.
        raw_mode: ``phase3`` (raw frames capped at ``raw_max_tokens`` rows, checkpoint projector) or ``orig``
            (raw frames at the group grid through the original projector). Default ``phase3``, as seed 000's
            ablation runner (``BudgetedVideoLLM(..., "phase3", args.raw_max_tokens)``), so plain predict and the
            ablation share it; seed 001's CLI defaults to ``orig`` (docs/deviations.md).
        raw_max_tokens: row cap of a raw frame in ``phase3``.
        max_tokens_per_frame: encode cap per frame (merged tokens).
        max_new_tokens: greedy answer length.
        prompt_template: template name or family of :mod:`datamodules.benchmarks.prompts`, or ``None`` (default)
            for VideoLLaMA3's own evaluation prompt per benchmark (``videollama3_videomme`` / ``_mlvu`` / ``_lvb``;
            the name goes into each record's ``meta.template``).
        dtype: model dtype: ``float32``, ``bfloat16`` or ``float16`` (anything else is a ``SettingError`` naming
            ``model.init_args.dtype``, raised here, before anything is written).
        attn_implementation: transformers attention backend of the LLM (and of the vision encoder when
            ``vision_attn_implementation`` is ``None``): ``sdpa`` (default) or ``flash_attention_2``, the seeds' kernel
            (seed 001:1074, with ``dtype: bfloat16`` and ``vision_attn_implementation: null`` as the seeds load the
            whole model; needs the ``flash_attn`` package, else a one-line ``SettingError`` here). The shared-prefix
            decode steps attend through :mod:`models.videollama3.shared_prefix` (SDPA) either way. README,
            deviations table.
        encode_chunk_frames: frames per vision-encoder call.
        vision_attn_implementation: vision-encoder attention (``frame_batched``: one SDPA call per layer over
            all frames of an encode; or a transformers backend name).
        decode: batched decode step: ``dynamic``, ``static`` or ``graph`` (CUDA graph); ``auto`` = ``graph`` on
            CUDA (see :meth:`decode_mode`), ``dynamic`` on the CPU.
        answer_mode: ``batched`` (all questions of a (video, budget) decode together from one prefix) or
            ``sequential`` (one question after another from the cropped prefix cache); token-identical.
        original_projector: ``raw_mode="orig"``: the original projector file (safetensors, or seed 001's ``.pt``
            state dict), instead of the checkpoint's ``original_projector/``.
        vision_config_dir: an original-layout checkpoint without ``vision_encoder_config``: a local directory with
            the vision encoder's ``config.json`` (otherwise derived from the weights where possible).
        overlap_budgets: start every budget's prefix (prefill, question suffixes, decode-graph capture) before
            decoding any, so the GPU is not left waiting while the host prepares the next budget
            (:meth:`BudgetedVideoLlama3.start_batched`); the same tokens. ``False``: one budget after the other,
            holding one prefix cache at a time (less GPU memory with many or large budgets).
        cudnn_attention: let PyTorch's SDPA pick cuDNN's attention in the vision encoder, the compressor and the
            prefix prefill (process-wide, :func:`models.vision_attention.allow_cudnn_sdpa`). Off by default:
            cuDNN builds an execution plan on the host for every new shape (frame counts, grids, prefix lengths
            change from video to video); its kernels are faster once a plan exists.
        add_system_prompt: render the chat template with ``add_system_prompt=True`` as seed 001 does (VideoLLaMA3's
            system turn before the user turn; default); ``False`` as VideoLLaMA3's own ``evaluation/`` renders it
            (no system turn). docs/deviations.md.
        early_start: start the weight load (straight to the device) and, on CUDA, the early compilation of the
            fused kernels in background threads: on a machine with CUDA when the module is built (this process's
            ``LOCAL_RANK`` GPU, inference mode: Lightning's predict defaults; 2.6-3.0 s before the
            trainer's set-up on the H200), else, or where the trainer then asks for another device or grad mode, at
            the trainer's set-up (``setup("predict")``); either way they overlap the rest of the set-up and the
            DataLoader's start. ``False``: both start at ``on_predict_start``, the load in the main thread. The same
            model, the same tokens.
        answer_rows: most questions of one (video, budget) prefix prefilled and decoded together (default 64); more are
            answered in several batches one after the other, so the decode batch and its question x vocabulary logits
            stay bounded however many questions a video has (10,000 questions on one video passed 8 GB before).
        answer_chunk: most question-suffix tokens (questions x tokens) in one suffix-prefill forward (default 2,048):
            questions are batched by length, and a longer batch (a long question) is prefilled in causal query chunks
            against the cached prefix, so its attention masks grow with the question, not with its square (a
            25,084-token question passed 8 GB on the CPU demo). A video's ordinary questions fit one batch and one
            chunk (the same tokens); split ones give the same tokens up to floating-point rounding
            (:class:`~models.videollama3.answering.SharedPrefixAnswering`). Not recorded in ``run.json``.
        first_step: (``kernels: inductor`` only; refused otherwise) ``wait`` (default): the first step waits for
            the early compilation; ``eager``: steps that
            start while it still runs use the eager math of the fused kernels and decode ``static`` (no CUDA
            graph), and the compiled kernels take over once it has ended (:attr:`models.kernels.Fusable.
            eager_while`). On CUDA in half precision the eager math rounds differently from the compiled kernels,
            so those first videos' tokens may differ: off by default.
        warm_first_calls: with the early start (CUDA), a second thread sets up cuDNN, cuBLAS and the flash
            attention kernels on small stand-ins (:func:`models.videollama3.warm.warm_first_calls`), so the first
            step does not (the vision tower's first ``conv2d`` took 0.33 s of it on the H100). The same tokens;
            ``timing_rank<r>.json``'s ``warmup`` gives its seconds. Not recorded in ``run.json``. On by default
            since session 12: with ``kernels: triton`` (H100, the whole workload-shaped set, one fresh process each)
            the first answer came 9.0-10.4 s after the module was built with it against 11.0-13.4 s without (first
            step 2.8-2.9 s against 3.4-4.1 s; records identical). With ``kernels: inductor`` it
            measured slower (session 10: 26.3-26.6 s against 25.9 s; its set-up shared the compilation's GIL).
        kernels: how the fused RMSNorm / rotary / SiLU-gate / add + LayerNorm kernels run on CUDA
            (:func:`models.kernels.set_mode`, process-wide): ``triton`` (default) hand-written Triton kernels
            (:mod:`models.triton_kernels`) holding the library's eager math and roundings, with nothing to compile
            but Triton's own kernels; ``inductor`` ``torch.compile`` of the same math (the default before
            2026-12-06: 13-14.5 s of compilation in the first answer with a warm cache on the H100, and it keeps
            intermediates in float32, so bfloat16 results round differently); ``eager`` the library's own
            kernels. The same on the CPU (eager math there). Recorded in ``run.json`` when not ``triton``.
        weight_reader: how the LLM's and vision tower's safetensors reach the device: ``pinned``
            :func:`models.weight_reader.read_safetensors` (threads reading the files through page-locked buffers
            into one device buffer per file, then transformers' load of that ``state_dict``); ``library``
            transformers' own loader (memory-mapped files, a pageable copy per tensor); ``auto`` (default) ``pinned``
            on CUDA, ``library`` elsewhere. The same bytes either way, so not recorded in ``run.json``. Session 13
            (H100, the whole workload-shaped set, with ``data.first_video_threads: 6``): the load 4.5-4.7 s against
            5.4-6.5 s, the first answer 16.3-16.5 s against 17.9-19.7 s; records identical. The parameters are
            views of the files' buffers (no second copy); a ``dtype`` other than the files' converts each tensor,
            so the load then peaks at the files' bytes plus the model's.
    """

    # settings recorded in run.json only when they differ from these defaults (absent there = the default, compared)
    RECORD_DEFAULTS = {"original_projector": None, "cudnn_attention": False, "add_system_prompt": True,
                       "first_step": "wait", "kernels": "triton"}

    def __init__(self, model_path: str = "checkpoints/tiny-videollama3", budgets: list[int] = (128, 256, 1024),
                 raw_mode: str = "phase3", raw_max_tokens: int = 256, max_tokens_per_frame: int = 256,
                 max_new_tokens: int = 16, prompt_template: str | None = None, dtype: str = "float32",
                 attn_implementation: str = "sdpa", encode_chunk_frames: int = 64, answer_mode: str = "batched",
                 vision_attn_implementation: str | None = "frame_batched", decode: str = "auto",
                 original_projector: str | None = None, vision_config_dir: str | None = None,
                 overlap_budgets: bool = True, cudnn_attention: bool = False, add_system_prompt: bool = True,
                 early_start: bool = True, first_step: str = "wait", answer_rows: int = 64, answer_chunk: int = 2048,
                 warm_first_calls: bool = True, kernels: str = "triton", weight_reader: str = "auto"):
        super().__init__()
        if not budgets:
            raise SettingError("model.init_args.budgets must not be empty")
        for b in budgets:
            if b < 64:
                raise SettingError(f"model.init_args.budgets: a budget of {b} vision tokens is smaller than one "
                                   "compressed group (64 rows)")
        if len(set(budgets)) != len(budgets):
            raise SettingError(f"model.init_args.budgets {list(budgets)} repeat a value")
        if answer_mode not in ("batched", "sequential"):
            raise SettingError(f"answer_mode must be 'batched' or 'sequential', got {answer_mode!r}")
        if decode not in DECODE_MODES:
            raise SettingError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
        for name, value in (("overlap_budgets", overlap_budgets), ("cudnn_attention", cudnn_attention),
                            ("add_system_prompt", add_system_prompt), ("early_start", early_start),
                            ("warm_first_calls", warm_first_calls)):
            if not isinstance(value, bool):   # (the CLI lets null through for a bool)
                raise SettingError(f"model.init_args.{name} must be true or false, got {value!r}")
        for name, value in (("answer_rows", answer_rows), ("answer_chunk", answer_chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SettingError(f"model.init_args.{name} must be an integer >= 1, got {value!r}")
        if weight_reader not in WEIGHT_READERS:
            raise SettingError(f"model.init_args.weight_reader must be one of {WEIGHT_READERS}, got {weight_reader!r}")
        if first_step not in FIRST_STEP_MODES:
            raise SettingError(f"model.init_args.first_step must be one of {FIRST_STEP_MODES}, got {first_step!r}")
        if kernels not in KERNEL_MODES:
            raise SettingError(f"model.init_args.kernels must be one of {KERNEL_MODES}, got {kernels!r}")
        if first_step != "wait" and kernels != "inductor":
            raise SettingError(f"model.init_args.first_step: {first_step} acts only with kernels: inductor (it runs "
                               f"the eager math while torch.compile works); kernels is {kernels!r}")
        set_kernel_mode(kernels)   # process-wide, before the early start below runs the kernels
        check_template(prompt_template)
        check_dtype("model.init_args.dtype", dtype)   # before anything is written (run.json, the output folder)
        check_attn_implementation("model.init_args.attn_implementation", attn_implementation, dtype)
        check_attn_implementation("model.init_args.vision_attn_implementation", vision_attn_implementation, dtype)
        self.save_hyperparameters()
        self.budgets = [int(b) for b in budgets]
        self.vlm: BudgetedVideoLlama3 | None = None
        self.last_stage_seconds: dict[str, float] = {}  # read by callbacks.timing.StageTimer
        self.load_seconds = 0.0                         # model load (on_predict_start), read by StageTimer
        self.warmup_report: dict = {}   # the first step's wait for the early compilation, graphs it still made
        # seconds after the process started (callbacks.timing.StageTimer puts them in timeline_s)
        self.timeline_marks: dict[str, float | None] = {"module_built": process_age_s()}
        self._loading = None            # the background weight load (early_start), joined by load_model
        self._compiling = None          # the early compilation thread, joined by the first step
        self._compile_started = False
        self._early_key = None          # (device, inference) the early compilation and load were started for
        self.eager_steps = 0            # steps run with eager kernels while the compilation ran (first_step=eager)
        if early_start and torch.cuda.is_available():
            # issue 41: start both now, on the device a predict run will use (this process's LOCAL_RANK GPU,
            # inference mode: Lightning's defaults), instead of at the trainer's set-up 2.6-2.7 s later (H200); set-up
            # starts them again where the trainer then says otherwise (another device, the CPU, grad mode)
            from models.device_start import rank_gpu

            self._start_early(torch.device("cuda", rank_gpu()), True)

    def setup(self, stage: str) -> None:
        self.timeline_marks.setdefault("setup", process_age_s())
        if stage == "predict" and self.hparams.get("early_start", True) and self.vlm is None:
            strategy = getattr(self._trainer, "strategy", None)
            device = getattr(strategy, "root_device", None) or self.device
            # the predict loop runs in inference mode unless the trainer says otherwise (the thread compiles the
            # graphs in the model's grad mode, warm.start)
            self._start_early(torch.device(device), bool(getattr(self._trainer, "_inference_mode", True)))

    def _start_early(self, device: torch.device, inference: bool) -> None:
        """Start the early compilation and the background weight load for ``(device, inference)``, once per key: a
        start made in ``__init__`` on the guessed device is kept when the trainer's set-up asks for the same; for
        another key the guessed load is dropped (its thread ends on its own; its GPU memory is freed with it) and both
        start anew."""
        key = (device, bool(inference))
        if self._early_key == key:
            return
        if self._early_key is not None:
            self._loading, self._compiling, self._compile_started = None, None, False
            Fusable.eager_while = None
        self._early_key = key
        self._start_compile(device, inference, inference_weights=False)   # the weights come from the load thread
        if self._loading is None:
            self.timeline_marks["load_start"] = process_age_s()
            self._loading = warm.in_background(lambda: self._read_model(device), "weight-load")

    def _start_compile(self, device: torch.device, inference: bool | None,
                       inference_weights: bool | None = None) -> None:
        """Start the early compilation of the fused kernels (once; nothing off CUDA, :func:`warm.start`).
        ``inference_weights``: whether the weights will be inference tensors (``False`` for the background load:
        a thread does not inherit the predict loop's inference mode, and the kernels taking weights, RMSNorm and
        add + LayerNorm, are guarded on it: compiled for the other kind they compiled again in the first step)."""
        if self._compile_started:
            return
        self._compile_started = True
        started = process_age_s()
        self._compiling = warm.start(self.hparams.model_path, device, getattr(torch, self.hparams.dtype), inference,
                                     inference_weights, first_calls=bool(self.hparams.get("warm_first_calls", True)))
        if self._compiling is not None:
            self.timeline_marks["early_compile_start"] = started
            if self.hparams.get("first_step", "wait") == "eager":
                Fusable.eager_while = self._compiling

    @property
    def jobs(self) -> dict[str, int]:
        """Job name -> budget."""
        return {job_name(b): b for b in self.budgets}

    def record_settings(self) -> dict:
        """Settings that determine a record (kept in the output folder's ``run.json``; budgets may be added below
        ``largest_budget``, which the videos are decoded for).

        Raises:
            FileNotFoundError: ``model_path`` is no checkpoint directory (said before the output folder's settings are
                compared, so a wrong path is never reported as a settings mismatch).
        """
        hp = self.hparams
        BudgetedVideoLlama3.checkpoint_dir(hp.model_path)
        bench = getattr(getattr(self._trainer, "datamodule", None), "benchmark", None)
        if bench is not None:   # a family without a prompt for the benchmark stops before the folder is written
            resolve_template(hp.prompt_template, bench)
        # only when not at their default (RECORD_DEFAULTS): folders written before these settings existed still resume
        optional = {"original_projector": str(Path(hp.original_projector).resolve())
                    if hp.get("original_projector") else None, "cudnn_attention": bool(hp.get("cudnn_attention")),
                    "add_system_prompt": bool(hp.get("add_system_prompt", True)),
                    "first_step": hp.get("first_step", "wait"), "kernels": hp.get("kernels", "triton")}
        extra = {k: v for k, v in optional.items() if v != self.RECORD_DEFAULTS[k]}
        if getattr(self, "decode_budget", None) is None:
            # every video is decoded for the largest budget and the smaller ones thinned from it, so it sets the frames
            # of every job: a larger budget added to a folder would mix two frame choices in each job
            extra["largest_budget"] = max(self.budgets)
        return {"model_path": str(Path(hp.model_path).resolve()), "raw_mode": hp.raw_mode, **extra,
                "raw_max_tokens": hp.raw_max_tokens, "max_tokens_per_frame": hp.max_tokens_per_frame,
                "max_new_tokens": hp.max_new_tokens, "prompt_template": recorded_template(hp.prompt_template), "dtype": hp.dtype,
                # the kernels: token-identical in fp32, but in bf16 they round differently and can pick other tokens
                "attn_implementation": hp.attn_implementation, "answer_mode": hp.answer_mode, "decode": hp.decode,
                "vision_attn_implementation": hp.vision_attn_implementation}

    def answerer(self):
        """``answer(prefix_prompt, question_texts, max_new_tokens) -> list[Answer]`` for this run's
        ``answer_mode`` and ``decode`` (``auto``: ``graph`` on CUDA, ``dynamic`` on the CPU). Plain predict and the
        layout ablation both answer through it, so an ablation's ``base`` job decodes exactly as plain predict."""
        if self.hparams.answer_mode == "sequential":
            return self.vlm.answer_all
        return functools.partial(self.vlm.answer_batched, decode=self.decode_mode())

    def decode_mode(self) -> str:
        """The batched decode step of this run: ``decode``, with ``auto`` = ``graph`` on CUDA, ``dynamic`` elsewhere.

        ``auto`` was ``static`` on CUDA from 2026-12-02 (the replayed decode graph hit a device-side ``index_copy_``
        bound assert on the H200: nothing kept the suffix ``StaticCache`` alive after ``start_batched`` returned, so
        the graph wrote into freed memory; the replay now holds it, CPU test
        ``test_replayed_decode_step_keeps_what_it_writes_alive``). ``tests/test_gpu.py``'s graph tests pass on the
        H200 at a7fdaaf, and graph decode stepped 1.55 s per video against 2.82 s with ``static`` there (issue 41),
        so ``auto`` is ``graph`` again. The graph replays the kernels of ``static``: the same tokens."""
        hp = self.hparams
        mode = hp.decode if hp.decode != "auto" else ("graph" if self.device.type == "cuda" else "dynamic")
        if mode == "graph" and self._compiling is not None and self._compiling.is_alive():
            return "static"   # first_step=eager: no capture of eager kernels while the compiled ones are made
        return mode

    def prompts(self, questions: list[Question], frame_times_s: list[float] | None = None
                ) -> tuple[list[str], list[str]]:
        """The question texts and their template names (``prompt_template``; default VideoLLaMA3's per benchmark).
        ``frame_times_s``: times (s) of the frames the model sees (Video-MME's subtitles keep only their lines)."""
        pairs = [prompt_and_template(q, self.hparams.prompt_template, frame_times_s) for q in questions]
        return [t for t, _ in pairs], [n for _, n in pairs]

    def starter(self):
        """:meth:`answerer` in two halves: ``start(prefix_prompt, question_texts, max_new_tokens) -> finish`` with
        ``finish() -> list[Answer]`` (batched: ``BudgetedVideoLlama3.start_batched``, which launches the prefills
        and the decode-graph capture and returns before decoding; sequential: answered at ``start``)."""
        if self.hparams.answer_mode == "sequential":
            return lambda *a: _done(self.vlm.answer_all(*a))
        return functools.partial(self.vlm.start_batched, decode=self.decode_mode())

    def answer_texts(self, answer, prompt, texts: list[str], names: list[str]) -> list:
        """``answer`` (from :meth:`answerer`) for question ``texts`` of one prefix ``prompt``, each under its
        template's system message and answer prefix (``prompts.chat_parts``; MLVU's released prompt has both) and
        text before the video (``prompts.pre_media_text``; VLMEvalKit's WorldSense):
        questions sharing them are answered together from one prefix. Answers in the order of ``texts``."""
        return self.start_texts(lambda *a: _done(answer(*a)), prompt, texts, names)()

    def start_texts(self, start, prompt, texts: list[str], names: list[str]):
        """:meth:`answer_texts` with ``start`` from :meth:`starter`: every template group's prefix is started now;
        the returned ``finish() -> list`` decodes them (answers in the order of ``texts``)."""
        groups: dict[tuple, list[int]] = {}
        for i, name in enumerate(names):
            groups.setdefault(chat_parts(name) + (pre_media_text(name),), []).append(i)
        started = []
        for (system, prefix, pre), idx in groups.items():
            p = self.vlm.with_chat(prompt, system, prefix, pre) if (system is not None or prefix or pre) else prompt
            started.append((idx, start(p, [texts[i] for i in idx], self.hparams.max_new_tokens)))

        def finish() -> list:
            out: list = [None] * len(texts)
            for idx, fin in started:
                for i, a in zip(idx, fin()):
                    out[i] = a
            return out

        return finish

    def check_before_output(self, trainer, settings: dict, defaults: dict) -> None:
        """A missing checkpoint is named before the writer creates anything or compares the output folder's
        settings (called by :class:`callbacks.jsonl_writer.JsonlPredictionWriter` first thing in its ``setup``;
        the data module no longer reads the checkpoint's video processor at its set-up on the CPU path).

        Raises:
            FileNotFoundError: ``model_path`` is not a checkpoint directory (the path named).
        """
        BudgetedVideoLlama3.checkpoint_dir(self.hparams.model_path)

    def frame_sizing(self) -> EncoderSizing:
        """The sizes this module's encodes read the frames at (every budget's grid, and the raw grid), with the
        checkpoint's video processor: the data module then holds each video at those sizes only
        (:class:`datamodules.decode.EncoderSizing`, ``data.hold_encoder_sizes``). Before the model is loaded the
        processor is a :class:`~models.videollama3.frame_sizes.LazyVideoProcessor`, read where it is first used
        (the decode workers)."""
        hp = self.hparams
        processor = self.vlm.video_processor if self.vlm is not None else LazyVideoProcessor(hp.model_path)
        return EncoderSizing(tuple(self.budgets), hp.max_tokens_per_frame, hp.raw_mode, hp.raw_max_tokens, processor)

    def on_predict_start(self) -> None:
        """Load the model here, not in ``setup``: Lightning has already started the DataLoader workers (a sized
        loader is not prefetched before this hook), so the first videos decode while the weights load instead
        of the GPU waiting for them afterwards (``load_seconds`` is reported by ``callbacks.timing.StageTimer``).
        On CUDA the fused kernels compile meanwhile from the checkpoint's config in a background thread
        (:mod:`models.videollama3.warm`); the first predict step waits for what is left of it."""
        from models.vision_attention import allow_cudnn_sdpa

        allow_cudnn_sdpa(self.hparams.get("cudnn_attention", False))
        if self.vlm is None:
            self._start_compile(self.device, None)   # (started at set-up with early_start)
        self.load_model()

    def load_model(self) -> None:
        """Load the VLM from ``model_path`` onto this module's device (once; ``load_seconds`` is 0 when it was
        already loaded, e.g. by an earlier ``predict`` call). A load started at set-up (``early_start``) is joined
        here: ``load_seconds`` is then this thread's wait for it (what the load still costs the run), and the
        timeline gets ``load_start`` / ``load_end`` (the load's own span)."""
        self.load_seconds = 0.0
        if self.vlm is None:
            t0 = time.perf_counter()
            loading, self._loading = self._loading, None
            vlm = loading.outcome() if loading is not None else self._read_model(self.device)
            self.vlm = vlm.to(self.device)
            self.load_seconds = time.perf_counter() - t0
            from models.device_start import early_cuda_marks
            from models.early_weights import early_weight_marks

            # the load's end, and the context and weight reads started beside the imports (evaluate.py), on this
            # timeline
            ends = {"load_end": loading.timings["end_perf_counter"]} if loading is not None else {}
            for name, t in {**ends, **early_cuda_marks(), **early_weight_marks()}.items():
                age = age_at(t)
                if age is not None:
                    self.timeline_marks[name] = age

    def on_predict_end(self) -> None:
        """Release the VLM at the end of predict (after the callbacks' ``on_predict_end``, which may still step it);
        a later ``predict`` loads it again (``on_predict_start``).

        Lightning's strategy teardown, which runs next, moves the module to the CPU: with the weights still on it
        that was a device-to-host copy of the whole checkpoint, 10 s of every run's end with the 7B-size checkpoint
        on the H100 (session 17 call 4: the main thread in ``Module._apply``'s lambda from 1.6 s to 11.6 s after
        ``predict_end``, ``bench/start_sampler.py``), and the 16 GB then held in host memory until the process
        ended. Nothing the run wrote depends on it."""
        self.vlm = None
        self._loading, self._early_key = None, None   # a later predict starts its load again (setup / predict start)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _read_model(self, device: torch.device) -> BudgetedVideoLlama3:
        """The VLM of ``model_path``, its weights read straight to ``device`` where the loader can
        (:meth:`BudgetedVideoLlama3.from_pretrained`'s ``device``)."""
        hp = self.hparams
        vlm = BudgetedVideoLlama3.from_pretrained(hp.model_path, dtype=hp.dtype,
                                                  attn_implementation=hp.attn_implementation, raw_mode=hp.raw_mode,
                                                  vision_attn_implementation=hp.vision_attn_implementation,
                                                  original_projector=hp.get("original_projector"),
                                                  vision_config_dir=hp.get("vision_config_dir"), device=device,
                                                  weight_reader=self.weight_reader_for(device))
        vlm.set_answer_batching(int(hp.get("answer_rows", 64)), int(hp.get("answer_chunk", 2048)))
        return vlm.set_system_prompt(bool(hp.get("add_system_prompt", True)))

    def weight_reader_for(self, device: torch.device) -> str:
        """``weight_reader`` with ``auto`` resolved for ``device``: ``pinned`` on CUDA, ``library`` elsewhere."""
        reader = self.hparams.get("weight_reader", "auto")
        if reader == "auto":
            return "pinned" if torch.device(device).type == "cuda" else "library"
        return reader

    def predict_step(self, item: dict, batch_idx: int = 0) -> list[dict]:
        thread = self._compiling
        if thread is not None and Fusable.eager_while is thread and thread.is_alive():
            self.eager_steps += 1       # first_step=eager: this step runs the eager kernels, the thread goes on
            self.warmup_report["eager_steps"] = self.eager_steps
            thread = None
        else:
            self._compiling = None
            if thread is not None and Fusable.eager_while is thread:
                Fusable.eager_while = None
        first = thread is not None
        if first:                       # the early compilation (on_predict_start) ends before the first forward
            t0 = time.perf_counter()
            warm.wait_for(thread)
            end = thread.timings.get("end_perf_counter")
            age = age_at(end) if end is not None else None
            if age is not None:
                self.timeline_marks["early_compile_end"] = age
            self.warmup_report = {**self.warmup_report, "compile_wait_s": round(time.perf_counter() - t0, 3),
                                  "early_compile": {k: v for k, v in getattr(thread, "timings", {}).items()
                                                    if k != "end_perf_counter"}}
            graphs = _graphs_compiled()
        jobs = self.jobs
        if item.get("error"):
            log.warning("video %s: %s", item["video_id"], item["error"])
            return error_records(item, jobs, item["error"])
        item, bad = split_question_errors(item)
        out = [error_record(item, q["qid"], q["answer"], q["meta"], job, jobs[job], q["error"])
               for q in bad for job in item["jobs"].get(q["qid"], [])]
        if item["questions"]:
            out += run_or_error_records(item, lambda: self._answer_video(item),
                                        lambda msg: error_records(item, jobs, msg))
        if first:   # graphs the first step still compiled (the early compilation's guards missed, or new kernels)
            self.warmup_report["graphs_compiled_in_first_step"] = _graphs_compiled() - graphs
            # the steps' intra-op thread count, which every graph is guarded on (early_compile's num_threads: the
            # one it compiled under; they differ where the launcher set a count after the module was built)
            self.warmup_report["step_num_threads"] = torch.get_num_threads()
        return out

    def _answer_video(self, item: dict) -> list[dict]:
        hp = self.hparams
        jobs = self.jobs
        needed = sorted({jobs[j] for js in item["jobs"].values() for j in js})
        frames = item["frames"]
        t0 = time.perf_counter()
        # non-blocking from pinned frames (the loader pins them on CUDA); a pageable copy is a blocking one
        cache = EncodeCache(self.vlm, frames.to(self.device, non_blocking=True), hp.encode_chunk_frames)
        inputs = prepare_budgets(self.vlm, cache.frames, item["times_s"], needed, hp.raw_mode, hp.raw_max_tokens,
                                 hp.max_tokens_per_frame, hp.encode_chunk_frames, cache=cache,
                                 subtitle_slots=interleaved_subtitles(item["questions"]))
        t1 = time.perf_counter()
        start = self.starter()
        questions = [Question(**q) for q in item["questions"]]
        records, started = [], []
        for bi in inputs:
            job = job_name(bi.budget)
            todo = [q for q in questions if job in item["jobs"].get(q.qid, [])]
            texts, names = self.prompts(todo, [item["times_s"][i] for i in bi.frame_idx])
            finish = self.start_texts(start, bi.prompt, texts, names)
            if not hp.overlap_budgets:   # one budget's prefix cache at a time
                finish = _done(finish())
            started.append((bi, job, todo, names, finish))
        for bi, job, todo, names, finish in started:
            stats = bi.plan.stats()
            records += [qa_record(item, q, a, stats, len(bi.frame_idx), job, bi.budget, None, name)
                        for q, a, name in zip(todo, finish(), names)]
        t2 = time.perf_counter()
        self.last_stage_seconds = {"encode": cache.encode_seconds, "plan_build": t1 - t0 - cache.encode_seconds,
                                   "answer": t2 - t1}
        return records
