"""What the bundle's own checks cost at load: the manifest schema, a pinned digest (`expect_digest`), a required
signature (`public_key`: the ECDSA check over model-signing's statement and the manifest's hash), each as a
ratio to a plain load measured in the same rounds; and, for scale, model-signing's own verification, which hashes
every byte (`mmtrt verify --public-key`).

The bundle is linked into a scratch folder (hard links: no bytes copied) and signed there with a fresh P-256 key.
Configurations alternate within every round, each round starting one further along (A B C D E, B C D E A,
...); medians. One ONNX Runtime thread,
spinning off, OMP_WAIT_POLICY=PASSIVE; the machine may be shared, so the ratios matter more than the seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["MMTRT_CACHE"] = tempfile.mkdtemp(prefix="bench-trust-")

from mmtrt.bundle.manifest import read_manifest  # noqa: E402
from mmtrt.bundle.schema import check_schema  # noqa: E402
from mmtrt.bundle.sign import sign_bundle, verify_signature  # noqa: E402
from mmtrt.runtime import load  # noqa: E402


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def signed_copy(bundle: Path, scratch: Path) -> tuple[Path, Path, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    copy = scratch / bundle.name
    shutil.copytree(bundle, copy, copy_function=os.link, ignore=shutil.ignore_patterns("model.sig", "engines"))
    key = ec.generate_private_key(ec.SECP256R1())
    (scratch / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))
    (scratch / "key.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                    serialization.PublicFormat.SubjectPublicKeyInfo))
    return copy, scratch / "key.pub", sign_bundle(copy, scratch / "key.pem")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-trust-") as tmp:
        bundle, pub, digest = signed_copy(args.bundle, Path(tmp))
        manifest = read_manifest(bundle)
        size = sum((bundle / name).stat().st_size for name in manifest["artifacts"])
        configs = {
            "plain load": lambda: load(bundle, threads=1, spin=False),
            "load, digest pinned": lambda: load(bundle, threads=1, spin=False, expect_digest=digest),
            "load, signature required": lambda: load(bundle, threads=1, spin=False, public_key=pub),
            "schema check alone": lambda: check_schema(bundle, read_manifest(bundle)),
            "model-signing verify (every byte)": lambda: verify_signature(bundle, pub),
        }
        load(bundle, threads=1, spin=False)  # the verified-files record and the page cache, as after a first load
        times = {name: [] for name in configs}
        names = list(configs)
        for r in range(args.rounds):  # each round starts one further along, so no check always runs first
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(timed(configs[name]))
    base = statistics.median(times["plain load"])
    print(f"{args.bundle}: {len(manifest['artifacts'])} artifacts, {size / 1e6:.0f} MB; medians of {args.rounds} "
          "rounds, 1 thread")
    print("| check | median ms | ratio to a plain load |\n| --- | --- | --- |")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {1e3 * med:.1f} | {med / base:.3f} |")


if __name__ == "__main__":
    main()
