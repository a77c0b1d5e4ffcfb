"""`mmtrt profile`: where a multimodal request's time and memory go, per stage, layer and head, with pictures.

Above the runtime: it loads bundles with `mmtrt.runtime`, drives the runtime's public pieces and ONNX Runtime's
own profiler, and reads the bundle's graphs; nothing below imports it.

- stages.py    stage timing, peak memory and throughput per batch size (the request driven piece by piece)
- sweeps.py    KV bytes and decode step against context; prefill with fewer image tokens
- trace.py     ORT profiler sessions, the Chrome trace, aggregation per op type and per layer (layers.py)
- heads.py     attention entropy, head redundancy, image-text alignment and patch saliency from probe graphs
- pictures.py, html.py, report.py   the PNGs, the page, the orchestration, the JSON and the suggestions
"""
