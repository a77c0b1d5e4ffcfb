"""The report page: one self-contained HTML file beside its PNGs, tables first, pictures below them."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

STYLE = ("body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:.5em 0}"
         "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#eee}"
         "td:first-child{text-align:left}img{max-width:100%;margin:.5em 0}")


def _table(head: list[str], rows: list[list[Any]]) -> str:
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _mib(n: int | None) -> float | None:
    return None if n is None else n / 2**20


def _bundle(k: int, r: dict[str, Any], pictures: list[str]) -> str:
    first = r["batches"][0]
    stage_rows = [[name, v["median"], v["p25"], v["p75"], 100 * v["share"], _mib(v["peak_rss_bytes"]),
                   _mib(v["rss_growth_bytes"]), _mib(v["kv_bytes"])] for name, v in first["stages"].items() if v]
    stage_rows.insert(next(i for i, row in enumerate(stage_rows) if row[0] == "decode") + 1,
                      [f"decode per token ({first['new_tokens'] - 1} steps)", first["decode_ms_per_token"], None, None,
                       None, None, None, None])
    stage_rows.append(["request (wall)", first["wall_ms"]["median"], first["wall_ms"]["p25"],
                       first["wall_ms"]["p75"], 100.0, None, None, None])
    batch_rows = [[row["batch"], row["wall_ms"]["median"], row["requests_per_s"], row["tokens_per_s"],
                   row["decode_ms_per_token"]] for row in r["batches"]]
    layer_rows = []
    for comp, agg in r["trace"]["components"].items():
        ops = ", ".join(f"{op} {100 * us / agg['total_us']:.0f} %" for op, us in list(agg["per_op_us"].items())[:4])
        layer_rows.append([comp, agg["graph_nodes"], agg["graph_nodes_run"], agg["ort_nodes"], agg["total_us"] / 1e3,
                           sum(agg["per_layer_median_us"].values()) / 1e3, _mib(agg["arena_peak_bytes"]), ops])
    ctx_rows = [[c["context"], _mib(c["kv_bytes"]), c["decode_step_ms"], c.get("why_not_measured", "")]
                for c in r["context"]]
    keep_rows = [[k["keep"], k["image_tokens"], k["sequence"], k["prefill_ms"]] for k in r["prefill_keeps"]]
    over = r["profiler_overhead"]
    align = r["heads"]["alignment"]["mean_cosine"]
    imgs = "".join(f'<img src="{escape(p)}" alt="{escape(p)}">' for p in pictures)
    return (f"<h2 id='b{k}'>{escape(r['bundle'])}</h2><p>sha256 {escape(r['bundle_sha256'][:16])}, backends "
            f"{escape(', '.join(f'{c}: {b}' for c, b in r['backends'].items()))}</p>"
            "<h3>Stages (batch 1)</h3>"
            + _table(["stage", "median ms", "p25", "p75", "share %", "peak RSS MiB", "RSS rise MiB", "KV MiB"],
                     stage_rows)
            + "<h3>Batch sizes</h3>"
            + _table(["batch", "request ms", "requests/s", "tokens/s", "decode ms/token"], batch_rows)
            + "<h3>Layers and ops (ONNX Runtime profiler)</h3>"
            + _table(["graph", "nodes", "nodes run", "ORT kernels", "kernel ms/request", "median calls",
                      "allocator peak MiB", "top ops"],
                     layer_rows)
            + f"<p>Chrome trace: <a href='{escape(r['trace_file'])}'>{escape(r['trace_file'])}</a>. Profiler "
              f"overhead: {over['profiled_ms']:.1f} ms with, {over['plain_ms']:.1f} ms without "
              f"({over['ratio']:.2f}x).</p>"
            + "<h3>KV cache and context</h3>"
            + _table(["context", "KV MiB (batch 1)", "decode step ms", "note"], ctx_rows)
            + "<h3>Prefill with fewer image tokens</h3>"
            + _table(["keep", "image tokens", "sequence", "prefill ms"], keep_rows)
            + f"<h3>Heads and tokens</h3><p>Image-text alignment (mean cosine): {align:.3f}</p>"
            + "<ul>" + "".join(f"<li>{escape(s)}</li>" for s in r["suggestions"]) + "</ul>" + imgs)


def write_html(report: dict[str, Any], path: Path) -> Path:
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mmtrt profile</title><style>{STYLE}"
             "</style></head><body><h1>mmtrt profile</h1>"]
    bundles = report["bundles"]
    if report["stage_ratios"]:
        names = [Path(r["bundle"]).name for r in bundles]
        rows = [[stage, *ratios] for stage, ratios in report["stage_ratios"].items()]
        parts.append("<h2>Side by side (time ratio to the first bundle, batch 1)</h2>"
                     + _table(["stage", *(f"{n} / {names[0]}" for n in names[1:])], rows)
                     + "".join(f'<img src="{escape(p)}" alt="{escape(p)}">' for p in report["pictures"]["compare"]))
    for k, r in enumerate(bundles):
        parts.append(_bundle(k, r, report["pictures"][r["bundle"]]))
    parts.append("</body></html>\n")
    path.write_text("".join(parts))
    return path
