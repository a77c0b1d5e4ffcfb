"""The night's report in three forms: nightly.json (everything), junit.xml (one test case per recipe, a failure
per fired rule, so CI systems show it natively) and index.html with the plots."""

from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from mmtrt.nightly import plots

JSON, JUNIT, HTML, PLOTS = "nightly.json", "junit.xml", "index.html", "plots"


def write(out: Path, data: dict[str, Any], series: list[dict[str, Any]]) -> dict[str, Path]:
    """Write all three; `series` is the history, to which the current night is added when it was not recorded."""
    out.mkdir(parents=True, exist_ok=True)
    if not data["recorded"]:
        series = series + [{**r, "label": data["night"]["label"]} for r in data["results"]]
    (out / JSON).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    (out / JUNIT).write_text(junit(data))
    images = draw(out / PLOTS, data, series)
    (out / HTML).write_text(page(data, images))
    return {"json": out / JSON, "junit": out / JUNIT, "html": out / HTML}


def draw(folder: Path, data: dict[str, Any], series: list[dict[str, Any]]) -> list[Path]:
    folder.mkdir(exist_ok=True)
    metrics = sorted({m for r in series for m in r["metrics"]})
    images = [plots.metric_over_nights(series, m, folder / f"{plots.safe_name(m)}.png") for m in metrics]
    summary = plots.current_vs_baseline(data["results"], folder / "current-vs-baseline.png")
    return ([summary] if summary else []) + images


def junit(data: dict[str, Any]) -> str:
    results = data["results"]
    suite = ET.Element("testsuite", name="mmtrt-nightly", tests=str(len(results)),
                       failures=str(sum(1 for r in results if r["status"] == "ok" and r["fired"])),
                       errors=str(sum(1 for r in results if r["status"] != "ok")),
                       timestamp=data["night"]["started_at"], time=str(data["night"]["wall_s"]))
    for r in results:
        case = ET.SubElement(suite, "testcase", classname="nightly", name=r["recipe"],
                             time=str(r["metrics"].get("build.compile_s", 0) if r["cache"] == "miss" else 0))
        if r["status"] != "ok":
            ET.SubElement(case, "error", message=r["error"], type=r["stage"]).text = r["error"]
        for f in r["fired"]:
            if f["rule"] != "failed_build":
                ET.SubElement(case, "failure", message=f["message"], type=f["rule"]).text = f["message"]
        facts = {k: r[k] for k in ("cache", "changed", "bundle_sha256", "metrics")}
        ET.SubElement(case, "system-out").text = json.dumps(facts, sort_keys=True)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


STYLE = """body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;font-size:90%;text-align:left}.fired{background:#fadbd8}
.ok{background:#d5f5e3}.failed{background:#f5b7b1}code{font-size:90%}img{max-width:100%;display:block;margin:.5em 0}"""


def _summary_row(r: dict[str, Any]) -> str:
    state = "failed" if r["status"] != "ok" else ("fired" if r["fired"] else "ok")
    why = "; ".join(r["changed"]) if r["cache"] == "miss" else ""
    rules = "<br>".join(html.escape(f"{f['rule']}: {f['message']}") for f in r["fired"])
    cells = [r["recipe"], r["status"] if r["status"] != "ok" else ("REGRESSED" if r["fired"] else "ok"),
             r["cache"] or "", why, (r["bundle_sha256"] or "")[:16]]
    return (f'<tr class="{state}">' + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
            + f"<td>{rules or html.escape(r['error'] or '')}</td></tr>")


def _metric_rows(r: dict[str, Any]) -> str:
    base = (r["baseline"] or {}).get("metrics", {})
    fired = {f.get("metric") for f in r["fired"]}
    rows = []
    for m, v in sorted(r["metrics"].items()):
        b = base.get(m)
        change = "" if b is None else (f"{100 * (v / b - 1):+.2f} %" if b else f"{v - b:+.6g}")
        cls = ' class="fired"' if m in fired else ""
        rows.append(f"<tr{cls}><td><code>{m}</code></td><td>{'' if b is None else f'{b:.6g}'}</td>"
                    f"<td>{v:.6g}</td><td>{change}</td></tr>")
    return "".join(rows)


def page(data: dict[str, Any], images: list[Path]) -> str:
    night = data["night"]
    head = (f"<h1>mmtrt nightly {html.escape(night['label'])}</h1><p>host {html.escape(night['host'])}, "
            f"{night['wall_s']} s, {len(data['results'])} recipes, {len(data['regressions'])} regression(s), "
            f"history {html.escape(data['history'])}{'' if data['recorded'] else ' (not recorded: a shard)'}</p>")
    summary = ("<table><tr><th>recipe</th><th>status</th><th>cache</th><th>rebuilt because</th><th>bundle</th>"
               "<th>regressions / error</th></tr>" + "".join(_summary_row(r) for r in data["results"]) + "</table>")
    details = "".join(
        f"<h3>{html.escape(r['recipe'])}</h3><table><tr><th>metric</th><th>baseline"
        f"{' (night ' + str(r['baseline']['night_id']) + ')' if r['baseline'] else ''}</th><th>current</th>"
        f"<th>change</th></tr>{_metric_rows(r)}</table>" for r in data["results"] if r["metrics"])
    pictures = "".join(f'<img src="{PLOTS}/{p.name}" alt="{p.stem}">' for p in images)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>mmtrt nightly {html.escape(night['label'])}"
            f"</title><style>{STYLE}</style></head><body>{head}<h2>Recipes</h2>{summary}<h2>Metrics</h2>{details}"
            f"<h2>Plots</h2>{pictures}</body></html>\n")
