"""The README is a page a new user scans (issue 43 item 4): the two commands first, short lines, the jobs table
before any long table, the deviations table on its own page, a legend that says what the console prints, and no
citation of documents the user does not have (DESIGN.md, issue numbers) in config headers or ``--model.help``."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
DEMO = ("python3.11 -m venv .venv && . .venv/bin/activate && pip install -e . && python -m models.videollama3.tiny "
        "&& python evaluate.py predict")
TESTS = "python3.11 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]' && pytest -q"
DEVIATIONS_HEADER = "| setting | default | what the reference does | why |"
# a citation a user cannot follow: the spec's sections or the project's issue numbers
CITATION = re.compile(r"DESIGN\b|§|\b[Ii]ssues? #?\d")


def tables(text: str) -> list[tuple[int, list[str]]]:
    """``(line index of the header, rows)`` of every markdown table (header and separator not counted)."""
    out, lines, k = [], text.splitlines(), 0
    while k < len(lines):
        if lines[k].startswith("|") and k + 1 < len(lines) and re.match(r"^\|(-+\|)+$", lines[k + 1]):
            start, k = k, k + 2
            rows = []
            while k < len(lines) and lines[k].startswith("|"):
                rows.append(lines[k])
                k += 1
            out.append((start, [lines[start]] + rows))
        else:
            k += 1
    return out


def test_no_line_over_300_characters():
    long = {k + 1: len(ln) for k, ln in enumerate(README.splitlines()) if len(ln) > 300}
    assert not long, long     # a7fdaaf: 40 lines over 300, the longest 3,331


def test_the_two_commands_come_first():
    """The first two code blocks are the set-up + demo and set-up + tests commands, under the first section."""
    blocks = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    assert blocks[:2] == [DEMO, TESTS]
    first_section = re.search(r"^## (.*)$", README, flags=re.M).group(1)
    assert first_section.startswith("Two commands")
    assert README.index(DEMO) < README.index("\n## ", README.index("## Two commands") + 1)


def test_jobs_table_comes_before_any_long_table():
    found = tables(README)
    assert found[0][1][0] == "| job | command |"                  # the first table is the jobs table
    jobs = {row.split("|")[1].strip() for row in found[0][1][1:]}
    assert {"layout ablations (seed 000)", "turn heads", "scoring"} <= jobs
    assert max(len(rows) - 1 for _, rows in found) <= 15             # a7fdaaf: a 42-row deviations table first


def test_deviations_table_moved_to_its_page_and_linked():
    page = (REPO / "docs" / "deviations.md").read_text(encoding="utf-8")
    assert "](docs/deviations.md)" in README and DEVIATIONS_HEADER not in README
    (rows,) = [rows for _, rows in tables(page) if rows[0] == DEVIATIONS_HEADER]
    assert len(rows) - 1 >= 40                         # the 40 rows of a7fdaaf, verbatim, and any added since
    assert all(row.count(" | ") >= 3 for row in rows[1:])
    assert any(row.startswith("| `model.baseline_run` (`LayoutAblationQA`") for row in rows)


def test_links_resolve():
    anchors = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", README, flags=re.M)}
    for target in re.findall(r"\]\(([^)]+)\)", README):
        if target.startswith("#"):
            assert target[1:] in anchors, target
        else:
            assert (REPO / target).exists(), target
    assert "](../README.md)" in (REPO / "docs" / "deviations.md").read_text(encoding="utf-8")


def test_a_real_run_is_in_short_sections():
    real = README[README.index("## A real run"):]
    real = real[:real.index("\n## ")]
    assert re.findall(r"^### (.*)$", real, flags=re.M)[:6] == [
        "Settings a folder locks", "Decoders", "Run order and timing", "Records, errors and resuming",
        "Checkpoint layout", "Compressor and segmenter"]
    paragraphs = [p for p in real.split("\n\n") if p.strip() and not p.startswith("```")]
    assert max(len(p) for p in paragraphs) < 1500       # a7fdaaf: one 5,900-character paragraph


def test_legend_says_what_the_console_prints():
    """The console divides by the questions scored; so does the README's legend (a7fdaaf: "correct / answered")."""
    from callbacks.scoring.console import format_table

    footer = format_table({"groups": []})
    assert "acc% = correct / scored" in footer and "n = questions scored" in footer
    legend = README[README.index("## Reading the score table"):]
    assert "- `n`: questions scored" in legend and "- `acc%`: correct / scored" in legend
    assert "correct / answered" not in legend.replace("Overall = correct / answered", "")


def test_config_headers_cite_nothing_the_user_lacks():
    bad = [f"{p.relative_to(REPO)}:{k + 1}" for p in sorted((REPO / "configs").rglob("*.yaml"))
           for k, ln in enumerate(p.read_text(encoding="utf-8").splitlines())
           if ln.lstrip().startswith("#") and CITATION.search(ln)]
    assert not bad, bad


@pytest.mark.parametrize("option", ["model", "data"])
def test_help_texts_cite_nothing_the_user_lacks(option):
    """``--model.help`` / ``--data.help`` print the class docstring and its ``__init__`` arguments' docs."""
    import importlib
    import inspect

    paths = sorted({m for p in (REPO / "configs").rglob("*.yaml")
                    for m in re.findall(r"^\s*" + option + r":\s*\n\s*class_path:\s*([\w.]+)",
                                        p.read_text(encoding="utf-8"), flags=re.M)})
    assert paths
    bad = []
    for path in paths:
        module, name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        for doc in (inspect.getdoc(cls), inspect.getdoc(cls.__init__)):
            bad += [f"{path}: {ln.strip()}" for ln in (doc or "").splitlines() if CITATION.search(ln)]
    assert not bad, bad


def test_the_annotation_copy_option_it_names_runs_on_the_demo_videos(tmp_path):
    """The README's way to run an edited copy of the demo's annotation (``loader_kwargs.parquet``) is a real
    setting: the copy's questions, the root's videos; ``video_dir`` stays relative to the root."""
    import shutil

    from datamodules.videoqa import VideoQADataModule

    assert "`--data.init_args.loader_kwargs.parquet=FILE`" in README
    copy = tmp_path / "mine.parquet"
    shutil.copy(REPO / "assets" / "videomme" / "test-demo.parquet", copy)
    dm = VideoQADataModule(root=str(REPO / "assets"), loader_kwargs={"video_dir": "media", "parquet": str(copy)},
                           num_workers=0)
    dm.setup("predict")
    assert len(dm.questions) == 7
    assert {Path(q.video_path) for q in dm.questions} == {REPO / "assets" / "media" / "cockatoo.mp4",
                                                         REPO / "assets" / "media" / "realshort.mp4"}
