"""Print DESIGN §5's accounting table (processor calls, prepared media seconds, state-update / payload-commit rows,
native boundaries per streaming mode) for streams of the given durations.

    python bench/accounting_table.py [--durations 4 60] [--memory-s 8]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from algorithms.streaming import accounting_table, format_accounting_table  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--durations", nargs="+", type=float, default=[4.0, 60.0], help="stream lengths, seconds")
    p.add_argument("--memory-s", type=float, default=8.0, help="memory horizon, seconds")
    a = p.parse_args(argv)
    for d in a.durations:
        print(f"## {d:g} s stream, {a.memory_s:g} s memory\n{format_accounting_table(accounting_table(d, a.memory_s))}\n")


if __name__ == "__main__":
    main()
