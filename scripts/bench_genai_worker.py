"""One measurement in a fresh process, for scripts/bench_kv.py's onnxruntime-genai comparison.

`mmtrt BUNDLE IDS_JSON NEW [THREADS]` runs in our venv (the mmtrt runtime), `genai MODEL_DIR IDS_JSON NEW` in the genai venv
(which cannot import mmtrt); each prefills the same token ids, decodes greedily, and prints one JSON line with
prefill and decode tokens/s, the decode's CPU milliseconds per token (process time: less
sensitive than wall time to other processes sharing the cores, since at 1 thread both engines run on the calling
thread) and the process's peak RSS (VmHWM: ru_maxrss would carry over the parent's peak
across exec on Linux).
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run_mmtrt(bundle: str, ids: list[int], new: int, threads: int) -> dict:
    import numpy as np

    from mmtrt.runtime import load
    from mmtrt.runtime.batch import Prepared
    from mmtrt.runtime.scheduler import run_to_end

    pipe = load(bundle, threads=threads, spin=threads > 1, prefix_cache_mib=0)  # spinning: load's default

    def generate(limit: int):
        prep = Prepared(0, ids, pipe.embed(np.array([ids], np.int64)), limit, {})
        return [seq for seq, delta in run_to_end(pipe, [prep]) if delta.finish_reason][0]

    cpu = time.process_time()
    seq = generate(new)
    cpu = time.process_time() - cpu
    timings = pipe.generation(seq).timings
    prefill_cpu = time.process_time()
    generate(1)  # the prefill alone (warm now, so the decode's CPU time below errs high, against us)
    decode_cpu = cpu - (time.process_time() - prefill_cpu)
    return {"layout": (pipe.kv or {}).get("layout", "hf"), "tokens": len(seq.tokens),
            "prefill_tok_s": len(ids) / (timings["prefill_ms"] / 1e3),
            "decode_tok_s": 1e3 / timings["decode_ms_per_token"],
            "decode_cpu_ms": 1e3 * decode_cpu / (len(seq.tokens) - 1)}


def run_genai(folder: str, ids: list[int], new: int, threads: int) -> dict:  # threads: in genai_config.json
    import onnxruntime_genai as og

    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + new)
    generator = og.Generator(model, params)
    t0 = time.perf_counter()
    generator.append_tokens(ids)  # the prefill: logits of the prompt's last position
    prefill_s = time.perf_counter() - t0
    generator.generate_next_token()  # picks the first token from the prefill's logits
    t0, cpu, steps = time.perf_counter(), time.process_time(), 0
    while not generator.is_done():
        generator.generate_next_token()  # one decode step, then the next pick
        steps += 1
    decode_s, cpu = time.perf_counter() - t0, time.process_time() - cpu
    return {"layout": "genai", "tokens": steps + 1, "prefill_tok_s": len(ids) / prefill_s,
            "decode_tok_s": steps / decode_s, "decode_cpu_ms": 1e3 * cpu / steps}


def peak_rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def main() -> None:
    engine, path, ids, new = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    row = (run_mmtrt if engine == "mmtrt" else run_genai)(path, ids, new, threads)
    row["peak_rss_mib"] = peak_rss_kib() / 1024
    print(json.dumps(row))


if __name__ == "__main__":
    main()
