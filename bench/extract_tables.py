"""The tables ``bench/extract_throughput.py`` prints: the rows (``format_table``), the compute-ceiling note, the
``--breakdown`` parts and the ``--fuse-slide-rows`` comparison (``format_fused_comparison``); each row is a dict of
``run_bench``."""
from __future__ import annotations


def _fmt_row(r: dict) -> str:
    llm = "-" if r["llm_tokens_per_s"] is None else f"{r['llm_tokens_per_s']:.0f}"
    ok = "yes" if r["dataset_rtf"] >= r["target"] else "no"
    ceil = ("- | - | -" if r.get("rtf_ceiling") is None else
            f"{r['tflop_per_media_s']:.3g} | {r['rtf_ceiling']:.2f}x | {r['of_ceiling_pct']:.0f}%")
    return (f"| {r['mode']} | {r['path']} | {r['policy']} | {r['sessions']} | {r['media_s']:.1f} | "
            f"{r['wall_s']:.2f} | {r['rtf']:.2f}x | {r['dataset_rtf']:.2f}x | {r['target']:g}x ({ok}) | "
            f"{r['peak_bytes'] / 2**30:.2f} | "
            f"{r['max_abs_diff']:.2e} | {r['vision_patches_per_s']:.2f} | {llm} | {ceil} |")


HEADER = ("| mode | path | policy | sessions | media s | wall s | RTF | dataset RTF | target (met) | peak GiB | "
          "max abs diff vs 1-session | vision patches / media s | LLM tokens / media s | TFLOP / media s | "
          "RTF ceiling | of ceiling |\n"
          "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")


def format_table(rows: list[dict]) -> str:
    return "\n".join([HEADER] + [_fmt_row(r) for r in rows])


def format_ceiling_note(rows: list[dict]) -> str:
    """The line above the table: the GEMM rate the ceiling columns use and what they mean."""
    r = next((r for r in rows if r.get("gemm_tflops") is not None), None)
    if r is None:
        return "no batched rows: no compute ceiling"
    return (f"compute ceiling at {r['gemm_tflops']:.1f} TFLOP/s ({r['gemm_source']}); TFLOP / media s = analytic "
            "matmul FLOPs of what the run computed (algorithms/encoder_flops.py) per media second, RTF ceiling = "
            "media s / (FLOPs / rate), of ceiling = dataset RTF / RTF ceiling")


def format_breakdown(rows: list[dict]) -> str:
    """The ``--breakdown`` table: per batched row, wall seconds of each part and its share of the run's wall."""
    from models.omni.batch import BREAKDOWN_PARTS

    parts = list(BREAKDOWN_PARTS)
    out = ["| mode | policy | sessions | wall s | " + " | ".join(p.replace("_", " ") for p in parts)
           + " | ms / media s / session (prep audio + prep video) |",
           "|---|---|---:|---:|" + "---:|" * len(parts) + "---:|"]
    for r in rows:
        b = r.get("breakdown")
        if not b:
            continue
        total = sum(b.values()) or 1.0
        per = 1000.0 * (b["prep_audio"] + b["prep_video"]) / r["media_s"]
        cells = " | ".join(f"{b[p]:.3f} ({100 * b[p] / total:.0f}%)" for p in parts)
        out.append(f"| {r['mode']} | {r['policy']} | {r['sessions']} | {r['wall_s']:.2f} | {cells} | {per:.2f} |")
    return "\n".join(out)


def format_fused_comparison(rows: list[dict]) -> str:
    """``--fuse-slide-rows``: each fused window row against its unfused twin (the row before it with the same
    mode, sessions, variant and K): dataset RTF, share of the compute ceiling, LLM calls, and the fused run's session
    0 state difference from the unfused one and from the 1-session path."""
    out = ["| mode | path (unfused) | sessions | dataset RTF unfused -> fused | speed-up | of ceiling unfused -> "
           "fused | LLM calls unfused -> fused | re-prefill calls | max abs diff fused vs unfused | fused vs "
           "1-session |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for j, r in enumerate(rows):
        if not r.get("fuse_slide_rows"):
            continue
        old = next((o for o in reversed(rows[:j]) if o["path"] + ", fused" == r["path"] and o["mode"] == r["mode"]
                    and o["policy"] == r["policy"] and o["sessions"] == r["sessions"]), None)
        if old is None:
            continue
        out.append(f"| {r['mode']} | {old['path']} | {r['sessions']} | {old['dataset_rtf']:.2f}x -> "
                   f"{r['dataset_rtf']:.2f}x | {r['dataset_rtf'] / old['dataset_rtf']:.3f} | "
                   f"{old['of_ceiling_pct']:.1f}% -> {r['of_ceiling_pct']:.1f}% | {old['llm_calls']} -> "
                   f"{r['llm_calls']} | {old['reprefill_calls']} -> {r['reprefill_calls']} | "
                   f"{r['vs_unfused']:.2e} | {r['max_abs_diff']:.2e} |")
    return "\n".join(out)
