"""LLM logits under the default attention (SDPA in the LLM, frame-batched SDPA in the vision tower) and under the
seeds' kernel (``attn_implementation="flash_attention_2"`` for the whole model, seed 001:1074), on one video prompt.

The same checkpoint is loaded once per setting (bfloat16 on CUDA, as the seeds load it; float32 on the CPU); the
video (``assets/media/cockatoo.mp4`` by default) is decoded once, laid out at one budget, a question appended, and
the logits of every position of that one forward are compared with the first setting's: max and mean absolute
difference, and the share of positions whose argmax token agrees. The vision rows are compared the same way.
Without the ``flash_attn`` package (or without CUDA) the flash setting is skipped with a message; ``--impls`` picks
other transformers backends (``eager`` vs ``sdpa`` on the CPU checks the bench itself).

    python bench/attn_logits.py                                   # tiny random model (built here)
    python bench/attn_logits.py --model-dir /ckpt/videollama3 --budget 4096
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

QUESTION = ("What animal is shown?\nA. A dog.\nB. A cockatoo.\nC. A cat.\nD. A fish.\n"
            "Answer with the option's letter from the given choices directly.")
# setting name -> (LLM attention, vision attention: None keeps the LLM's, as the seeds load the whole model)
SETTINGS = {"sdpa": ("sdpa", "frame_batched"), "flash_attention_2": ("flash_attention_2", None),
            "eager": ("eager", "eager")}


def unavailable(impl: str, cuda: bool) -> str | None:
    """Why setting ``impl`` cannot run here (``None``: it can)."""
    if impl == "flash_attention_2":
        if importlib.util.find_spec("flash_attn") is None:
            return "the flash_attn package is not installed"
        if not cuda:
            return "flash_attention_2 needs CUDA"
    return None


def forward(model_dir: str, impl: str, video: Path, budget: int, device: str, dtype) -> dict:
    """One setting's vision rows and logits (float32, on the host) for the video prompt + :data:`QUESTION`."""
    import torch

    from datamodules.decode import decode_video
    from models.videollama3 import BudgetedVideoLlama3, prepare_budgets

    llm_attn, vision_attn = SETTINGS[impl]
    vlm = BudgetedVideoLlama3.from_pretrained(model_dir, dtype=dtype, attn_implementation=llm_attn,
                                              vision_attn_implementation=vision_attn).to(device)
    dec = decode_video(video, budget)
    (bi,) = prepare_budgets(vlm, dec.frames.to(vlm.device), dec.times_s, [budget], raw_mode="phase3")
    q_ids, fallback = vlm.question_ids(bi.prompt, QUESTION)
    head = bi.prompt.ids[:-bi.prompt.last_text_len] if fallback and bi.prompt.last_text_len else bi.prompt.ids
    ids = torch.cat([head, torch.tensor(q_ids, dtype=head.dtype)])
    with torch.inference_mode():
        logits = vlm.model(inputs_embeds=vlm.embed(ids, bi.prompt.vision_embeds)).logits[0].float().cpu()
    out = {"vision": bi.prompt.vision_embeds.float().cpu(), "logits": logits, "seq_len": int(ids.numel())}
    del vlm
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def compare(model_dir: str, impls: list[str], video: Path, budget: int, device: str | None = None) -> dict:
    """Run each available setting of ``impls``; differences against the first one. Returns ``{"device", "dtype",
    "skipped": {impl: why}, "rows": [{impl, seq_len, vision_max_abs, vision_mean_abs, logits_max_abs,
    logits_mean_abs, argmax_agree}]}``."""
    import torch

    cuda = torch.cuda.is_available() if device is None else device == "cuda"
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    skipped = {i: why for i in impls if (why := unavailable(i, cuda))}
    runs = {i: forward(model_dir, i, video, budget, device, dtype) for i in impls if i not in skipped}
    rows = []
    if runs:
        ref = runs[next(iter(runs))]
        for impl, r in runs.items():
            if r["logits"].shape != ref["logits"].shape:
                raise ValueError(f"{impl}: logits {tuple(r['logits'].shape)} vs {tuple(ref['logits'].shape)}")
            dv, dl = (r["vision"] - ref["vision"]).abs(), (r["logits"] - ref["logits"]).abs()
            rows.append({"impl": impl, "seq_len": r["seq_len"], "vision_max_abs": float(dv.max()),
                         "vision_mean_abs": float(dv.mean()), "logits_max_abs": float(dl.max()),
                         "logits_mean_abs": float(dl.mean()),
                         "argmax_agree": float((r["logits"].argmax(-1) == ref["logits"].argmax(-1)).float().mean())})
    return {"device": device, "dtype": str(dtype).replace("torch.", ""), "skipped": skipped, "rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=None, help="a checkpoint (default: the tiny random model, built here)")
    ap.add_argument("--impls", nargs="+", default=["sdpa", "flash_attention_2"], choices=sorted(SETTINGS),
                    help="settings to compare; differences are against the first")
    ap.add_argument("--video", default=str(REPO / "assets" / "media" / "cockatoo.mp4"))
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--device", default=None, choices=("cpu", "cuda"))
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = ap.parse_args(argv)
    from models.videollama3.tiny import model_dir_or_tiny

    with model_dir_or_tiny(args.model_dir, prefix="attn_logits_") as model_dir:
        res = compare(model_dir, args.impls, Path(args.video), args.budget, args.device)
    if args.json:
        print(json.dumps(res))
        return
    for impl, why in res["skipped"].items():
        print(f"skipped {impl}: {why}")
    print(f"{res['device']}, {res['dtype']}, budget {args.budget}; differences against {args.impls[0]}")
    print(f"{'setting':<18} {'tokens':>7} {'logit max|d|':>13} {'logit mean|d|':>14} {'argmax same':>12} "
          f"{'vision max|d|':>14}")
    for r in res["rows"]:
        print(f"{r['impl']:<18} {r['seq_len']:7d} {r['logits_max_abs']:13.4g} {r['logits_mean_abs']:14.4g} "
              f"{r['argmax_agree']:12.4f} {r['vision_max_abs']:14.4g}")


if __name__ == "__main__":
    main()
