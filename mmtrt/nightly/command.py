"""`mmtrt nightly NIGHTLY.yaml`: run a night (or a shard of one, or merge shards) and print the outcome."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mmtrt.bundle.staging import sigterm_as_interrupt
from mmtrt.errors import UserError
from mmtrt.nightly.config import parse_shard

EXIT_INTERRUPTED = 143
HISTORY_ENV = "MMTRT_NIGHTLY_HISTORY"


def main(args) -> int:
    from mmtrt.nightly import night

    history = args.history or os.environ.get(HISTORY_ENV)
    try:
        with sigterm_as_interrupt():  # a CI runner cancelling the job unwinds like Ctrl-C: no transaction commits
            if args.merge:
                if args.shard:
                    raise UserError("--merge combines finished shards; give it without --shard")
                data = night.merge(Path(args.config), args.merge, args.output, history)
            else:
                data = night.run(Path(args.config), args.output, parse_shard(args.shard), history, args.label)
    except KeyboardInterrupt:
        print("mmtrt: nightly interrupted; the history and the cache are as they were", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(json.dumps(data) if args.json else describe(data, args.output))
    return data["exit_code"]


def describe(data: dict, out: Path) -> str:
    lines = []
    for r in data["results"]:
        state = "FAILED" if r["status"] != "ok" else ("REGRESSED" if r["fired"] else "ok")
        why = f" (rebuilt: {'; '.join(r['changed'])})" if r["cache"] == "miss" else ""
        lines.append(f"{r['recipe']}: {state}, cache {r['cache'] or '-'}{why}")
        lines += [f"  {f['rule']}: {f['message']}" for f in r["fired"]]
    recorded = f"recorded as night {data['night']['id']}" if data["recorded"] else "not recorded (a shard)"
    lines.append(f"{len(data['regressions'])} regression(s); {recorded}; report in {out}/index.html")
    return "\n".join(lines)
