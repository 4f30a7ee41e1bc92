"""What the gate of ``stagefrontier compare --fail-above`` says: its one line, a Markdown summary
for a pull-request comment, and JUnit XML a CI shows as one test case."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ..analysis.compare import Comparison
from ..analysis.gate import EXIT_FAIL, EXIT_PASS, Growth, Verdict
from .compare_text import percent_change
from .escape import printable

JUNIT_SUITE = "stagefrontier compare"


def gate_line(v: Verdict, base: str, new: str) -> str:
    """``GATE FAIL: ...`` (``PASS``, ``NOT COMPARABLE``): the outcome, the step's medians and
    their shift, why, and on a failure the stages and ranks that grew with their shares."""
    head = f"GATE {v.outcome.upper()}: {base} -> {new}"
    if v.shift_ms != v.shift_ms:  # NaN: refused before anything was measured
        return printable(f"{head}: {v.reason}")
    text = (
        f"{head}: median step {v.base_median_ms:.1f} -> {v.new_median_ms:.1f} ms "
        f"({v.shift_ms:+.1f} ms{percent_change(v.shift_ms, v.base_median_ms)}), {v.reason}"
    )
    if v.growth:
        text += "; grew: " + "; ".join(f"{g.stage} {_growth(g)}" for g in v.growth)
    return printable(text)


def _growth(g: Growth) -> str:
    ranks = ", ".join(f"rank {r} {ms:+.1f} ms" for r, ms in g.ranks) or "no single rank"
    if g.every_rank:
        ranks += ": every rank alike, as on a slower host"
    return f"{g.delta_ms:+.1f} ms/step ({g.share:.1%} of the change; {ranks})"


def gate_markdown(v: Verdict, c: Comparison | None, base: str, new: str) -> str:
    """A pull-request comment: the outcome and why, the medians, and on a measured comparison
    the table of each stage's change (the deltas add up to the exposed change exactly)."""
    mark = {EXIT_PASS: "passed", EXIT_FAIL: "failed"}.get(v.status, "could not judge")
    lines = [
        f"### Step-time gate {mark} ({v.threshold})",
        "",
        f"`{_code(base)}` -> `{_code(new)}`: {_cell(v.reason)}.",
        "",
    ]
    if v.growth:
        lines += [f"- **{_cell(g.stage)}** {_cell(_growth(g))}" for g in v.growth] + [""]
    if c is None:
        return "\n".join(lines)
    lines += [
        f"Median step {v.base_median_ms:.1f} -> {v.new_median_ms:.1f} ms "
        f"({v.base_steps} and {v.new_steps} steps); mean exposed step "
        f"{c.base_means.exposed_ms:.1f} -> {c.new_means.exposed_ms:.1f} ms "
        f"({c.delta_exposed_ms:+.1f} ms).",
        "",
        "| stage | base ms/step | new ms/step | change ms/step |",
        "|---|---:|---:|---:|",
    ]
    base_ms, new_ms = c.base_means.advance_ms, c.new_means.advance_ms
    for stage, delta in c.delta_advance_ms.items():
        cells = f"{base_ms[stage]:.1f} | {new_ms[stage]:.1f} | {delta:+.1f}"
        lines.append(f"| {_cell(stage)} | {cells} |")
    lines.append(
        f"| **exposed** | {c.base_means.exposed_ms:.1f} | {c.new_means.exposed_ms:.1f} "
        f"| {c.delta_exposed_ms:+.1f} |"
    )
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell or list item: escaped, pipes kept literal."""
    return printable(text).replace("|", "\\|")


def _code(text: str) -> str:
    return printable(text).replace("`", "'")


def gate_junit(v: Verdict, line: str) -> str:
    """One test suite with one test case: a failure element on a failed gate, an error element
    when the runs could not be judged, the gate's line as the case's output."""
    failed = v.status == EXIT_FAIL
    errored = v.status not in (EXIT_PASS, EXIT_FAIL)
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=JUNIT_SUITE,
        tests="1",
        failures=str(int(failed)),
        errors=str(int(errored)),
        skipped="0",
    )
    case = ET.SubElement(suite, "testcase", classname="stagefrontier.gate", name="step time")
    if failed or errored:
        ET.SubElement(
            case, "failure" if failed else "error", message=printable(v.reason)
        ).text = line
    ET.SubElement(case, "system-out").text = line
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
