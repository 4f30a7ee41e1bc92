"""The figures the docs quote come from the benchmark results files.

The summary tables of README.md and docs/performance.md name, in their last column, the results
files in ``benchmarks/results/`` that back each row; the evaluation table of docs/performance.md
names the script (``routing.py``) in its first column, whose results file is ``routing.md``, and
the paper's figures in its last. Every number in a row's answer (its second column) must appear
in one of those files as written there, or be listed in ``ROUNDED``: a figure the docs round,
convert (bytes to kB) or add up, with the exact texts it comes from, checked to give the quoted
value.
A benchmark re-run that changes a figure therefore fails here until the docs say the new value.
No benchmark runs: this reads text files.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", ROOT / "docs" / "performance.md"]

NUMBER = re.compile(r"(?<![\w.^])\d+(?:,\d{3})*(?:\.\d+)?")
"""A figure: digits with thousands commas and decimals, not part of a name (E1, RQ1, x4)."""

ROUNDED: dict[tuple[str, str], tuple[tuple[str, ...], float]] = {
    # (results file, figure as the docs quote it): (the texts in the file, the unit's scale)
    ("analyzer.md", "4,096"): (("4096",), 1.0),  # the table writes ranks without commas
    ("node_transport.md", "1.8"): (("1771",), 1e-3),  # bytes per rank and window, in kB
    ("profiler_compare.md", "73"): (("72.95",), 1.0),  # MB of Kineto trace
    ("scale.md", "0.2"): (("211.9",), 1e-3),  # kB rank 0 reads at 1,000 ranks, in MB
    ("scale-100k.md", "0.55"): (("552.3",), 1e-3),  # and at 100,000
    ("scale-100k.md", "24"): (("24.0",), 1.0),  # % of the flat bytes at 100,000
    ("scale-100k.md", "42.5"): (("41,475.0", "978.2", "20.2"), 1e-3),  # kB by level, in MB
    ("scale-100k.md", "177"): (("177,009.4",), 1e-3),  # kB of the flat path, in MB
}
"""Figures the docs round, convert or add up: the quoted figure must be the sum of the file's
figures, times the scale, rounded to the quoted decimals."""


def summary_rows(doc: Path) -> list[tuple[str, list[str]]]:
    """``(answer, results files)`` of every table row whose last cell names results files, or
    whose first cell names a benchmark script with a results file."""
    rows = []
    for line in doc.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        named = re.findall(r"[\w-]+\.md", cells[-1])
        named = named or [f"{script}.md" for script in re.findall(r"`(\w+)\.py`", cells[0])]
        files = [f for f in named if (RESULTS / f).is_file()]
        if len(cells) >= 3 and files:
            rows.append((cells[1], sorted(set(files))))
    return rows


def appears(figure: str, text: str) -> bool:
    """``figure`` written in ``text`` as a whole number: not a part of a longer one."""
    return re.search(rf"(?<![\d.])(?<!\d,){re.escape(figure)}(?!\d|[.,]\d)", text) is not None


def number(figure: str) -> float:
    return float(figure.replace(",", ""))


def decimals(figure: str) -> int:
    return len(figure.partition(".")[2])


ROWS = [(doc.name, answer, files) for doc in DOCS for answer, files in summary_rows(doc)]


def test_the_summary_tables_name_results_files() -> None:
    for doc in DOCS:
        assert len(summary_rows(doc)) >= 5, doc


@pytest.mark.parametrize(
    ("doc", "answer", "files"), ROWS, ids=[f"{d}:{a[:40]}" for d, a, _ in ROWS]
)
def test_each_quoted_figure_comes_from_its_results_file(
    doc: str, answer: str, files: list[str]
) -> None:
    texts = {name: (RESULTS / name).read_text(encoding="utf-8") for name in files}
    unbacked = []
    for figure in NUMBER.findall(answer):
        if any(appears(figure, text) for text in texts.values()):
            continue
        source = next(
            ((name, ROUNDED[name, figure]) for name in files if (name, figure) in ROUNDED), None
        )
        if source is None:
            unbacked.append(figure)
            continue
        name, (exact, scale) = source
        for part in exact:
            assert appears(part, texts[name]), f"{doc}: {figure} from {part!r}, not in {name}"
        value = sum(number(part) for part in exact) * scale
        assert round(value, decimals(figure)) == number(figure), f"{doc}: {exact} is not {figure}"
    assert not unbacked, f"{doc} quotes {unbacked} that {files} do not hold: {answer}"


def test_every_rounded_figure_is_still_quoted() -> None:
    quoted = {
        (name, figure)
        for _, answer, files in ROWS
        for name in files
        for figure in NUMBER.findall(answer)
    }
    assert not set(ROUNDED) - quoted, "ROUNDED lists figures no doc quotes any more"
