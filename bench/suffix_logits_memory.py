"""Peak memory and time of the question-suffix prefill: logits at every suffix position (the path before issue 35:
``VideoLlama3ForConditionalGeneration`` drops ``logits_to_keep``) vs the last position only (hidden states sliced
before ``lm_head``, :meth:`models.videollama3.answering.SharedPrefixAnswering._last_logits`).

One long question of ``--question-tokens`` tokens and a short one are answered together (``answer_batched``,
``--decode``) from one video prefix. Each path runs in a fresh process (``--run-one``): on the CPU the peak is the
growth of the process's peak RSS (``ru_maxrss``) over the answer call, after a warm-up with the short questions; on
CUDA it is ``torch.cuda.max_memory_allocated`` over the call. The greedy tokens of both paths are compared.

    python bench/suffix_logits_memory.py                       # tiny model on the CPU, a 2,000-token question (the old path: ~2.4 GB)
    python bench/suffix_logits_memory.py --question-tokens 6000 --decode static
"""
from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHORT = ["What animal is shown?\nA. A dog.\nB. A cockatoo.\nAnswer with the letter."]


def _long_question(tokenizer, n_tokens: int) -> str:
    """A question of about ``n_tokens`` tokens (a repeated sentence, then options)."""
    sentence = "The bird on the branch turns its head towards the camera and opens its crest. "
    per = len(tokenizer(sentence, add_special_tokens=False).input_ids)
    return sentence * max(1, n_tokens // per) + "What does the bird do?\nA. It flies.\nB. It opens its crest."


def run_one(path: str, model_dir: str, question_tokens: int, decode: str) -> dict:
    """Answer the questions with one suffix-logits path in this process; returns peak memory (MiB), time and tokens."""
    import torch

    from datamodules.decode import decode_video
    from models.videollama3 import BudgetedVideoLlama3, prepare_budgets
    from models.videollama3.answering import SharedPrefixAnswering

    if path == "full":   # lm_head over every suffix position, then the last one read (the old path)
        SharedPrefixAnswering._last_logits = lambda self, **kw: self.model(**kw).logits[:, -1:]
    cuda = torch.cuda.is_available()
    vlm = BudgetedVideoLlama3.from_pretrained(model_dir)
    if cuda:
        vlm = vlm.to("cuda")
    dec = decode_video(REPO / "assets" / "media" / "cockatoo.mp4", 1024)
    (bi,) = prepare_budgets(vlm, dec.frames.to(vlm.device), dec.times_s, [128], raw_mode="phase3")
    questions = [_long_question(vlm.tokenizer, question_tokens)] + SHORT
    n_long = len(vlm.question_ids(bi.prompt, questions[0])[0])
    vlm.answer_batched(bi.prompt, SHORT, max_new_tokens=4, decode=decode)          # warm-up
    t0 = time.perf_counter()
    with added_peak(cuda) as peak:
        answers = vlm.answer_batched(bi.prompt, questions, max_new_tokens=4, decode=decode)
    seconds = time.perf_counter() - t0
    return {"path": path, "device": "cuda" if cuda else "cpu", "prefix_len": int(bi.prompt.ids.numel()),
            "long_question_tokens": n_long, "rows": len(questions), "peak_mib": peak["bytes"] / 2**20,
            "seconds": seconds, "tokens": [a.token_ids for a in answers]}



@contextlib.contextmanager
def added_peak(cuda: bool):
    """The peak memory the block adds, in bytes, as ``out["bytes"]`` on exit: CUDA ``max_memory_allocated`` over
    what was allocated before it (peak statistics reset first); on the CPU the growth of the process's peak RSS
    (``ru_maxrss``), so only a block that raises the process's peak counts."""
    import torch

    out: dict = {}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        yield out
    finally:
        if cuda:
            torch.cuda.synchronize()
            out["bytes"] = torch.cuda.max_memory_allocated() - base
        else:
            out["bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base

def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--question-tokens", type=int, default=2000)
    ap.add_argument("--decode", default="dynamic", choices=("dynamic", "static", "graph"))
    ap.add_argument("--model-dir", default=None, help="a checkpoint (default: the tiny random model, built here)")
    ap.add_argument("--run-one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_one:
        print(json.dumps(run_one(args.run_one, args.model_dir, args.question_tokens, args.decode)))
        return
    from models.videollama3.tiny import model_dir_or_tiny

    rows = []
    with model_dir_or_tiny(args.model_dir, prefix="suffix_logits_") as model_dir:
        for path in ("full", "last"):
            out = subprocess.run([sys.executable, __file__, "--run-one", path, "--model-dir", model_dir,
                                  "--question-tokens", str(args.question_tokens), "--decode", args.decode],
                                 check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    r0 = rows[0]
    print(f"suffix prefill, {r0['device']}, decode={args.decode}: prefix {r0['prefix_len']} tokens, "
          f"{r0['rows']} questions (longest {r0['long_question_tokens']} tokens)")
    print(f"{'logits at':<22} {'peak (MiB)':>11} {'answer (s)':>11}")
    for r, name in zip(rows, ("every position (old)", "last position (new)")):
        print(f"{name:<22} {r['peak_mib']:11.1f} {r['seconds']:11.3f}")
    print(f"same greedy tokens: {rows[0]['tokens'] == rows[1]['tokens']}")


if __name__ == "__main__":
    main()
