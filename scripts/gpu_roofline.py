"""The GPU check's `ncu` step: Nsight Compute times each case of docs/results/plugin-roofline.md's table
(gpu_kernel_check.py --roofline launches them in the table's order, ROOFLINE_LAUNCHES times each) and each median
is held between the bounds of that table's last column. ncu flushes the caches before every profiled launch (its
default cache control) and is told to leave the clocks as it finds them."""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "plugin-roofline.md"
BOUNDS = re.compile(r"([\d.]+) to ([\d.]+) us")
UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
# the kernel (activation fp16) each row of the page times
KERNELS = {"TokenSelect": "mmtrt_token_select_f16", "TokenSelectMerge": "mmtrt_token_select_merge_f16",
           "TokenSelectDynamic": "mmtrt_token_select_dynamic_f16", "Int4GroupGemm": "mmtrt_int4_gemm_f16_f16"}


def cases(page: Path = PAGE) -> list[dict]:
    """The table's rows: the case as the page words it, the plugin, and the bounds in microseconds."""
    rows = []
    for line in page.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 7 or not (m := BOUNDS.fullmatch(cells[-1])):
            continue
        plugin = cells[0].split(",")[0]
        rows.append({"case": cells[0], "plugin": plugin, "kernel": KERNELS[plugin],
                     "floor_us": float(m.group(1)), "ceiling_us": float(m.group(2))})
    return rows


def command(python: str, kernels: Path, log: Path) -> list[str]:
    return ["ncu", "--clock-control", "none", "--csv", "--print-units", "base", "--metrics", "gpu__time_duration.sum",
            "-k", "regex:^mmtrt_", "--log-file", str(log), python, str(ROOT / "scripts" / "gpu_kernel_check.py"),
            "--kernels", str(kernels), "--roofline"]


def launches(log_text: str) -> list[tuple[str, float]]:
    """(kernel name, microseconds) of every profiled launch, in launch order, from ncu's CSV."""
    lines = log_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("ncu's log holds no CSV table")
    found = []
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            value = float(row["Metric Value"].replace(",", ""))
            found.append((int(row["ID"]), row["Kernel Name"].split("(")[0], value * UNITS[row["Metric Unit"]]))
    return [(name, us) for _, name, us in sorted(found)]


def judge(rows: list[dict], timed: list[tuple[str, float]], per_case: int) -> tuple[bool, str, list[dict]]:
    """Each case's median against its bounds; the launches must come in the page's order, per_case of each."""
    if len(timed) != len(rows) * per_case:
        return False, f"ncu timed {len(timed)} launches, {len(rows) * per_case} expected", []
    results, ok = [], True
    for i, row in enumerate(rows):
        chunk = timed[i * per_case:(i + 1) * per_case]
        names = {name for name, _ in chunk}
        median = statistics.median(us for _, us in chunk)
        case_ok = names == {row["kernel"]} and row["floor_us"] <= median <= row["ceiling_us"]
        ok &= case_ok
        results.append({**row, "kernels_seen": sorted(names), "median_us": round(median, 3),
                        "over_floor": round(median / row["floor_us"], 2), "ok": case_ok})
    worst = max(results, key=lambda r: r["median_us"] / r["ceiling_us"])
    return ok, (f"{sum(r['ok'] for r in results)}/{len(results)} cases within the page's bounds; "
                + "; ".join(f"{r['plugin']} {r['median_us']:.2f} us ({r['over_floor']}x floor)" for r in results)
                + f"; closest to its ceiling: {worst['case'][:40]}"), results
