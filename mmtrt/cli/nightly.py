"""The `nightly` command's arguments; the work is mmtrt/nightly's."""

from __future__ import annotations

from pathlib import Path

from mmtrt.cli.arguments import examples


def _nightly(args) -> int:
    from mmtrt.nightly.command import main as nightly

    return nightly(args)


def add_command(sub) -> None:
    p = sub.add_parser("nightly", help="compile, evaluate and benchmark a recipe matrix; compare with the last good night",
                       description="A scheduled build: a recipe matrix through a build cache, evaluated and "
                       "benchmarked, compared with the last good night (docs/NIGHTLY.md); exit code 1 on a regression.",
                       epilog=examples("mmtrt nightly scripts/nightly.yaml -o nightly-report",
                                       "mmtrt nightly scripts/nightly.yaml --shard 1/2 -o shard1"))
    p.add_argument("config", help="NIGHTLY.yaml (docs/NIGHTLY.md)")
    p.add_argument("-o", "--output", type=Path, default=Path("nightly-report"), help="report folder")
    p.add_argument("--shard", metavar="I/N", help="run every N-th recipe from the I-th (plus the reference); record nothing")
    p.add_argument("--merge", nargs="+", type=Path, metavar="SHARD_DIR", help="record the shards' reports as one night")
    p.add_argument("--history", help="SQLite file or SQLAlchemy URL (default: the config's `history:`)")
    p.add_argument("--label", help="the night's name in the history (default: the UTC start time)")
    p.add_argument("--json", action="store_true", help="print the night's outcome as JSON")
    p.set_defaults(func=_nightly)
