"""Fair comparison of the three streaming modes: same head, same seeds, same rows; one table.

    python bench/compare_turn_modes.py --config configs/fit/turn_head.yaml [--config <delta.yaml>] \
        --seeds 0 1 2 [--modes open-stream-replay completed-block-hold micro-chunk-200ms] [--extra --trainer.max_epochs=10]

Demo on synthetic features (CPU, about a minute):

    python -m datamodules.synthetic_turns --out outputs/demo_turns
    python bench/compare_turn_modes.py --config configs/fit/turn_head.yaml --config configs/fit/turn_head_demo.yaml

For every (mode, seed) it runs ``train.py fit`` through ``train.cli_main`` with ``--data.init_args.expected_mode=<mode>
--seed_everything=<seed>`` (everything else from the configs), then ``test`` on the best checkpoint (ModelCheckpoint
on ``val/auroc_mean``), and prints a markdown table of test metrics as mean ± sample std over seeds, plus the mean
training epoch time and training rows per second. W&B is off here unless ``--wandb`` is given (then one run per
(mode, seed), grouped by mode).

Results stay in the run folder (``--out``, default ``runs/compare_turn_modes/<date-time>``): ``results.md`` (the
table, under a line saying that it holds test metrics, mean ± sample std over seeds), ``results.csv`` (one row
per (mode, seed): every test metric, ``epoch_time_s``, ``rows_per_s``) and ``results.json``; each run's
``metrics.csv`` stays in its sub-folder. Checkpoints are deleted once their run is tested (``--keep-checkpoints``
keeps them); ``--json`` also writes the per-run metrics elsewhere.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = ("open-stream-replay", "completed-block-hold", "micro-chunk-200ms")
COLUMNS = ("auroc_mean", "ap_mean", "auroc_va_wearer", "auroc_va_others", "auroc_f3_wearer", "auroc_f3_others",
           "sh_bacc", "sh_f1w")


def run_one(configs: list[str], mode: str, seed: int, out_dir: Path, extra: list[str], wandb: bool,
            keep_checkpoints: bool = False) -> dict[str, float]:
    """Fit + test one (mode, seed); returns test metrics plus ``epoch_time_s`` and ``rows_per_s`` (last epoch).
    The run's ``*.ckpt`` files under ``out_dir`` are deleted after the test unless ``keep_checkpoints``."""
    from train import cli_main

    args = ["fit"] + [a for c in configs for a in ("--config", c)] + [
        f"--data.init_args.expected_mode={mode}", f"--seed_everything={seed}",
        f"--trainer.default_root_dir={out_dir}", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false"]
    if wandb:
        args += [f"--trainer.logger.init_args.save_dir={out_dir}", f"--trainer.logger.init_args.group={mode}",
                 f"--trainer.logger.init_args.name={mode}-s{seed}"]
    else:
        args += ["--trainer.logger=false"]
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI reads args only; keep it from warning about ours
    try:
        cli = cli_main(args + extra)
    finally:
        sys.argv = argv
    train_m = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("train/")}
    res = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False,
                           ckpt_path=cli.trainer.checkpoint_callback.best_model_path)[0]   # best.ckpt
    out = {k.removeprefix("test/"): float(v) for k, v in res.items()}
    out["epoch_time_s"] = train_m.get("train/epoch_time_s", float("nan"))
    out["rows_per_s"] = train_m.get("train/rows_per_s", float("nan"))
    if wandb:
        import wandb as wb

        wb.finish()   # the next (mode, seed) gets its own W&B run, not this one reused
    if not keep_checkpoints:
        for f in out_dir.rglob("*.ckpt"):
            f.unlink()
    return out


def write_results(out_root: Path, results: dict[str, list[dict[str, float]]], seeds: list[int], table: str) -> None:
    """``results.md`` (``table``), ``results.csv`` (one row per (mode, seed), metric columns sorted) and
    ``results.json`` in ``out_root``."""
    out_root.mkdir(parents=True, exist_ok=True)
    (out_root / "results.md").write_text(table + "\n")
    (out_root / "results.json").write_text(json.dumps(results, indent=1))
    keys = sorted({k for runs in results.values() for r in runs for k in r})
    with open(out_root / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "seed", *keys])
        for mode, runs in results.items():
            for seed, r in zip(seeds, runs):
                w.writerow([mode, seed, *[r.get(k, "") for k in keys]])


def results_preamble(seeds: list[int]) -> str:
    """What ``results.md``'s table holds, written above it: which split the metrics are of, which checkpoint, and
    what ``±`` is."""
    return ("# Turn heads: the three streaming modes compared\n\n"
            "Metrics of the **test** split (`train.py test` on each run's best checkpoint by `val/auroc_mean`), "
            f"each cell the mean ± the sample standard deviation over {len(seeds)} seed(s) "
            f"({', '.join(str(s) for s in seeds)}; ± 0 for one seed). `epoch_time_s` and `rows_per_s`: training "
            "epoch time and training rows per second, the same way. Per run: `results.csv`.\n\n")


def format_table(results: dict[str, list[dict[str, float]]], columns: tuple[str, ...] = COLUMNS) -> str:
    """Markdown table: one row per mode, ``mean ± std`` over seeds (std = sample std; 0 for one seed)."""
    cols = list(columns) + ["epoch_time_s", "rows_per_s"]
    lines = ["| mode | seeds | " + " | ".join(cols) + " |", "|---|---:|" + "---:|" * len(cols)]
    for mode, runs in results.items():
        cells = []
        for c in cols:
            vals = [r[c] for r in runs if c in r]
            if not vals:
                cells.append("n/a")
                continue
            mean = statistics.fmean(vals)
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            cells.append(f"{mean:.0f} ± {sd:.0f}" if c == "rows_per_s" else f"{mean:.3f} ± {sd:.3f}")
        lines.append(f"| {mode} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="Train the same turn head on each mode's features and compare.")
    p.add_argument("--config", action="append", required=True, help="train.py config(s), stacked in order")
    p.add_argument("--modes", nargs="+", default=list(MODES))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", default=None, help="run folder (default: runs/compare_turn_modes/<date-time>)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep every run's checkpoints (deleted otherwise)")
    p.add_argument("--wandb", action="store_true", help="keep the config's W&B logger (grouped by mode)")
    p.add_argument("--json", default=None, help="write all per-run metrics here")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py arguments (last)")
    a = p.parse_args(argv)
    out_root = Path(a.out) if a.out else Path("runs/compare_turn_modes") / time.strftime("%Y%m%d-%H%M%S")
    print(f"runs (logs, results.md / .csv / .json) in {out_root}", flush=True)
    results: dict[str, list[dict[str, float]]] = {}
    for mode in a.modes:
        for seed in a.seeds:
            results.setdefault(mode, []).append(
                run_one(a.config, mode, seed, out_root / f"{mode}_s{seed}", a.extra, a.wandb, a.keep_checkpoints))
    table = results_preamble(a.seeds) + format_table(results)   # says: test metrics, mean ± sample std over seeds
    print(table)
    write_results(out_root, results, a.seeds, table)
    print(f"results: {out_root / 'results.md'}, {out_root / 'results.csv'}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return table


if __name__ == "__main__":
    main()
