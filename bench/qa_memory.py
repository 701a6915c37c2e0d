"""Peak RSS of the CPU demo (``python evaluate.py predict``, tiny random VideoLLaMA3, fp32, ``decode=auto`` =
``dynamic``) on annotations that stress the question-suffix prefill and the batched decode (issue 44 item 1).

Cases (each a Video-MME-format benchmark made in a temporary folder from ``assets/videomme/test-demo.parquet`` and
the bundled videos):

* ``demo``: the demo's own 7 questions (ordinary questions: the answers of both checkouts are compared);
* ``long``: the demo with the cockatoo's first question replaced by one of about ``--long-tokens`` (25,084) tokens,
  under the model's 32,768-position context;
* ``many``: ``--many`` (10,000) short questions on the cockatoo video.

Each run is a fresh process; its peak RSS is the ``ru_maxrss`` that ``os.wait4`` reports for it, and a guard kills it
when its resident set passes ``--guard-gb`` (8 GB, as the reliability trial's guard). ``--before REF`` also runs the
same cases on the code of git revision ``REF`` (extracted with ``git archive``, the same Python environment), so the
table shows before / after::

    python bench/qa_memory.py --before 79d1091              # all three cases, before and after
    python bench/qa_memory.py --cases long --long-tokens 8000
    python bench/qa_memory.py --before 6058e55 --cases demo long --answer-mode sequential   # answer_all
    python bench/qa_memory.py --direct on --model-dir checkpoints/tiny-videollama3 --cases long   # one process
    python bench/qa_memory.py --direct on --path fallback --cases long --decode dynamic   # the fallback path
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SENTENCE = "The bird on the branch turns its head towards the camera and opens its crest. "


def _rows(case: str, long_tokens: int, many: int) -> list[dict]:
    """The annotation rows of ``case`` (Video-MME parquet columns)."""
    import pyarrow.parquet as pq

    demo = pq.read_table(REPO / "assets" / "videomme" / "test-demo.parquet").to_pylist()
    if case == "demo":
        return demo
    if case == "long":
        from models.tokenizer import build_qwen_tokenizer

        per = len(build_qwen_tokenizer()(SENTENCE, add_special_tokens=False).input_ids)
        rows = [dict(r) for r in demo]
        first = next(i for i, r in enumerate(rows) if r["videoID"] == "cockatoo")
        rows[first]["question"] = SENTENCE * max(1, long_tokens // per) + rows[first]["question"]
        return rows
    if case == "many":
        base = next(r for r in demo if r["videoID"] == "cockatoo")
        return [{**base, "question_id": f"{base['video_id']}-{i + 1}",
                 "question": f"Question {i}: what does the bird do {'now ' * (i % 7)}?",
                 "answer": "ABCD"[i % 4]} for i in range(many)]
    raise ValueError(f"unknown case {case!r}")


def make_bench(root: Path, rows: list[dict]) -> Path:
    """A benchmark root: ``videomme/test-bench.parquet`` and ``videos/<videoID>.mp4``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "videomme").mkdir(parents=True)
    (root / "videos").mkdir()
    for vid in {r["videoID"] for r in rows}:
        shutil.copy(REPO / "assets" / "media" / f"{vid}.mp4", root / "videos" / f"{vid}.mp4")
    pq.write_table(pa.Table.from_pylist(rows), root / "videomme" / "test-bench.parquet")
    return root


def _rss(pid: int) -> int:
    """Resident set of ``pid`` in bytes (0 once it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_predict(code: Path, model_dir: Path, bench: Path, out: Path, guard: int, answer_mode: str = "batched"
                ) -> dict:
    """``evaluate.py predict`` of checkout ``code`` on ``bench`` (``answer_mode``: the model's setting); returns peak
    RSS (bytes), seconds, whether the guard killed it, and the responses by (job, qid)."""
    cmd = [sys.executable, "evaluate.py", "predict", f"--model.init_args.model_path={model_dir}",
           f"--data.init_args.root={bench}", "--data.init_args.loader_kwargs.video_dir=videos",
           f"--trainer.callbacks.init_args.out_dir={out}"]
    if answer_mode != "batched":
        cmd.append(f"--model.init_args.answer_mode={answer_mode}")
    env = {**os.environ, "PYTHONPATH": str(code)}
    log = open(out.with_suffix(".log"), "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT)
    killed = []

    def watch():
        while proc.poll() is None:
            if _rss(proc.pid) > guard:
                killed.append(time.perf_counter() - t0)
                proc.send_signal(signal.SIGKILL)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    watcher.join()
    log.close()
    seconds = time.perf_counter() - t0
    responses = {}
    for f in out.glob("b*/*/rank*.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            responses[(r["job"], r["qid"])] = r.get("response", r.get("error"))
    return {"peak": usage.ru_maxrss * 1024, "seconds": seconds, "killed_at": killed[0] if killed else None,
            "rc": proc.returncode, "responses": responses, "log": str(out.with_suffix(".log"))}


def source(ref: str | None, into: Path) -> Path:
    """The code to run: this tree (``ref`` None), the folder ``ref``, or git revision ``ref`` extracted into
    ``into``."""
    if ref is None:
        return REPO
    if Path(ref).is_dir():
        return Path(ref).resolve()
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def direct(model_dir: str, case: str, long_tokens: int, many: int, decode: str, caps: bool,
           path: str = "batched") -> dict:
    """``case``'s cockatoo questions answered in this process, at the demo's largest budget (1,024): the peak memory
    it adds (CUDA: ``max_memory_allocated``; CPU: the growth of ``ru_maxrss``) and its seconds.
    ``caps=False``: ``answer_rows`` and ``answer_chunk`` so large that every question is one batch and one chunk
    (the path before issue 44). ``path``: ``batched`` (``answer_batched``), ``sequential`` (``answer_all``),
    ``fallback`` (each question with two leading newlines, which merge with the prefix's last piece: DESIGN §3.7's
    fallback through ``answer_all``) or ``one_pass`` (those questions by ``answer_from_scratch(one_pass=True)``,
    what the fallback ran before issue 44 item 1)."""
    import torch

    from datamodules.decode import decode_video
    from models.videollama3 import BudgetedVideoLlama3, prepare_budgets

    cuda = torch.cuda.is_available()
    vlm = BudgetedVideoLlama3.from_pretrained(model_dir, device="cuda" if cuda else None)
    if not caps:
        vlm.set_answer_batching(1 << 30, 1 << 30)
    dec = decode_video(REPO / "assets" / "media" / "cockatoo.mp4", 1024)
    (bi,) = prepare_budgets(vlm, dec.frames.to(vlm.device), dec.times_s, [1024], raw_mode="phase3")
    texts = [r["question"] for r in _rows(case, long_tokens, many) if r["videoID"] == "cockatoo"]
    if path in ("fallback", "one_pass"):
        texts = ["\n\n" + t for t in texts]
        assert all(vlm.question_ids(bi.prompt, t)[1] for t in texts)

    def answer(qs):
        if path == "batched":
            return vlm.answer_batched(bi.prompt, qs, max_new_tokens=16, decode=decode)
        if path == "one_pass":
            return [vlm.answer_from_scratch(bi.prompt, t, max_new_tokens=16, one_pass=True) for t in qs]
        return vlm.answer_all(bi.prompt, qs, max_new_tokens=16)

    answer(texts[-1:])                                                                  # warm-up (graph capture)
    from suffix_logits_memory import added_peak

    t0 = time.perf_counter()
    with added_peak(cuda) as peak:
        try:
            answer(texts)
            outcome = "ok"
        except torch.OutOfMemoryError:
            outcome = "out of memory"
    return {"case": case, "path": path, "caps": caps, "decode": decode, "device": "cuda" if cuda else "cpu", "questions": len(texts),
            "prefix": int(bi.prompt.ids.numel()), "peak_gb": peak["bytes"] / 1e9, "seconds": time.perf_counter() - t0,
            "outcome": outcome}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["demo", "long", "many"], choices=("demo", "long", "many"))
    ap.add_argument("--before", default=None, help="git revision (of this repository) or source folder to compare "
                                                   "with (its code, this environment)")
    ap.add_argument("--after", default=None, help="git revision or folder to measure instead of this tree")
    ap.add_argument("--long-tokens", type=int, default=25_084)
    ap.add_argument("--many", type=int, default=10_000)
    ap.add_argument("--guard-gb", type=float, default=8.0)
    ap.add_argument("--model-dir", default=None, help="a checkpoint (default: the tiny random model, built here)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, outputs)")
    ap.add_argument("--direct", default=None, choices=("on", "off"),
                    help="no CLI: answer_batched in this process with the caps on or off (prints one JSON line per "
                         "case; CUDA when there is one)")
    ap.add_argument("--decode", default="graph", help="--direct: the decode mode")
    ap.add_argument("--path", default="batched", choices=("batched", "sequential", "fallback", "one_pass"),
                    help="--direct: the answer path (see direct())")
    ap.add_argument("--answer-mode", default="batched", choices=("batched", "sequential"),
                    help="the CLI runs' model.answer_mode (sequential: one question after another, answer_all)")
    args = ap.parse_args(argv)
    if args.direct:
        from models.videollama3.tiny import model_dir_or_tiny

        with model_dir_or_tiny(args.model_dir, prefix="qa_memory_") as model_dir:
            for case in args.cases:
                print(json.dumps(direct(model_dir, case, args.long_tokens, args.many, args.decode,
                                        args.direct == "on", args.path)), flush=True)
        return
    tmp = Path(tempfile.mkdtemp(prefix="qa_memory_"))
    try:
        model_dir = args.model_dir
        if model_dir is None:
            from models.videollama3.tiny import build_tiny_videollama3

            model_dir = build_tiny_videollama3(tmp / "tiny")
        model_dir = Path(model_dir).resolve()
        codes = [(f"{label} {ref}" if ref else "this tree", source(ref, tmp / label))
                 for label, ref in (("before", args.before), ("after", args.after)) if ref or label == "after"]
        guard = int(args.guard_gb * 1e9)
        results = []
        for case in args.cases:
            bench = make_bench(tmp / f"bench_{case}", _rows(case, args.long_tokens, args.many))
            per_code = []
            for name, code in codes:
                r = run_predict(code, model_dir, bench, tmp / f"out_{case}_{len(per_code)}", guard, args.answer_mode)
                per_code.append(r)
                outcome = (f"killed by the {args.guard_gb:g} GB guard at {r['killed_at']:.0f} s" if r["killed_at"]
                           else f"rc {r['rc']}, {len(r['responses'])} records")
                results.append((case, name, r["peak"] / 1e9, r["seconds"], outcome))
                print(f"{case:<5} {name:<18} peak RSS {r['peak'] / 1e9:6.2f} GB  {r['seconds']:7.1f} s  {outcome}",
                      flush=True)
            if len(per_code) == 2 and all(r["rc"] == 0 for r in per_code):
                a, b = (r["responses"] for r in per_code)
                same = sum(a[k] == b.get(k) for k in a)
                results.append((case, "same responses", None, None, f"{same} of {len(a)}"))
        print(f"\nCPU demo (tiny model, fp32, decode auto=dynamic, answer_mode={args.answer_mode}); long question "
              f"~{args.long_tokens} tokens, many = {args.many} questions on one video")
        print(f"| case | code | peak RSS (GB) | wall (s) | outcome |\n|---|---|---:|---:|---|")
        for case, name, peak, sec, outcome in results:
            print(f"| {case} | {name} | {'' if peak is None else f'{peak:.2f}'} | "
                  f"{'' if sec is None else f'{sec:.1f}'} | {outcome} |")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
