"""Which bundle a load may run: its identity (the sha256 of its manifest, which lists every artifact's sha256)
pinned by the caller, and its signature (`mmtrt sign`, OpenSSF model-signing with an elliptic-curve key).

The signature is model-signing's format: a Sigstore bundle whose DSSE envelope holds an in-toto statement listing
every file of the bundle with its sha256. A load checks the ECDSA signature over the envelope (as model-signing's
key verifier does, with `cryptography`), then that the statement lists exactly manifest.json, with the manifest's
own digest, and the manifest's artifacts, with their digests; `verify_bundle` then checks the artifacts' content.
So a signed load costs one signature check and the manifest's hash, not a second hash of every byte (`mmtrt verify
BUNDLE --public-key KEY` runs model-signing's own verifier, which does)."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmtrt.bundle.manifest import MANIFEST, read_manifest
from mmtrt.bundle.schema import SIGNATURE
from mmtrt.errors import UserError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE = "https://model_signing/signature/v1.0"
IGNORED = {"engines", SIGNATURE, "build_report.json"}  # what `mmtrt sign` leaves unsigned


@dataclass(frozen=True)
class Trust:
    expect_digest: str | None = None
    public_key: str | Path | None = None


def manifest_digest(bundle: Path) -> str:
    path = Path(bundle) / MANIFEST
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        raise UserError(f"{bundle} is not an mmtrt bundle (no {MANIFEST}); pass the folder `mmtrt compile` "
                        "wrote") from None


def check_trust(bundle: Path, trust: Trust) -> str:
    """The bundle's digest, after the pin and the signature the caller asked for are checked."""
    digest = manifest_digest(bundle)
    if trust.expect_digest is not None:
        expected = trust.expect_digest.strip().lower().removeprefix("sha256:")
        if expected != digest:
            raise UserError(f"bundle {bundle} has digest sha256:{digest}, not the expected sha256:{expected}; it is "
                            "another bundle or was changed since (`mmtrt inspect` prints a bundle's digest)")
    if trust.public_key is not None:
        check_signature(Path(bundle), Path(trust.public_key), digest)
    return digest


def check_signature(bundle: Path, public_key: Path, digest: str) -> None:
    signed = signed_files(bundle, public_key)
    if signed.get(MANIFEST) != digest:
        raise UserError(f"bundle {bundle}: {MANIFEST} differs from what its signature covers; it was changed after "
                        "signing: restore it or sign it again")
    expected = {MANIFEST: digest, **read_manifest(bundle)["artifacts"]}
    differ = sorted(name for name in signed.keys() | expected.keys() if signed.get(name) != expected.get(name))
    if differ:
        raise UserError(f"bundle {bundle} differs from what its signature covers ({', '.join(differ[:3])}); it was "
                        "changed after signing: restore it or sign it again")


def signed_files(bundle: Path, public_key: Path) -> dict[str, str]:
    """The files and sha256 digests the signature in `bundle` covers, once its signature checks with the key."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = _public_key(public_key, serialization, ec)
    payload_type, payload, signature = _envelope(bundle)
    if payload_type != PAYLOAD_TYPE:
        raise UserError(f"{bundle / SIGNATURE} signs a {payload_type!r} payload, not an in-toto statement; sign the "
                        "bundle again with `mmtrt sign`")
    algorithm = {256: hashes.SHA256(), 384: hashes.SHA384(), 521: hashes.SHA512()}[key.curve.key_size]
    try:
        key.verify(signature, pae(payload_type, payload), ec.ECDSA(algorithm))
    except InvalidSignature:
        raise UserError(f"the signature of bundle {bundle} does not verify with {public_key}: another key signed it, "
                        "or it was changed; sign it again or pass the signer's public key") from None
    return _statement_files(bundle, payload)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature is over."""
    return b"DSSEv1 %d %s %d " % (len(payload_type.encode()), payload_type.encode(), len(payload)) + payload


def _public_key(path: Path, serialization, ec):
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except OSError as exc:
        raise UserError(f"cannot read public key {path} ({exc.strerror}); pass the PEM file of the signer's "
                        "public key") from None
    except ValueError:
        raise UserError(f"{path} is not a PEM public key; pass the signer's public key (openssl ec -pubout)") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in ("secp256r1", "secp384r1",
                                                                               "secp521r1"):
        raise UserError(f"{path} is not an elliptic-curve key on P-256, P-384 or P-521, which model-signing uses")
    return key


def _envelope(bundle: Path) -> tuple[str, bytes, bytes]:
    path = bundle / SIGNATURE
    if not path.is_file():
        raise UserError(f"bundle {bundle} is not signed (no {SIGNATURE}); sign it with `mmtrt sign {bundle} --key "
                        "KEY`, or load it without a public key")
    try:
        envelope = json.loads(path.read_bytes())["dsseEnvelope"]
        return (envelope["payloadType"], base64.b64decode(envelope["payload"], validate=True),
                base64.b64decode(envelope["signatures"][0]["sig"], validate=True))
    except (ValueError, KeyError, IndexError, TypeError):
        raise UserError(f"{path} is not a model-signing signature (a Sigstore bundle with a DSSE envelope); sign "
                        "the bundle again") from None


def _statement_files(bundle: Path, payload: bytes) -> dict[str, str]:
    bad = UserError(f"{bundle / SIGNATURE} signs something other than a bundle's files (model-signing's `files` "
                    "statement with sha256); sign the bundle with `mmtrt sign`")
    try:
        statement = json.loads(payload)
        serialization = statement["predicate"]["serialization"]
        if statement["predicateType"] != PREDICATE or not _serialization_ok(serialization):
            raise bad
        files = {r["name"]: r["digest"] for r in statement["predicate"]["resources"] if r["algorithm"] == "sha256"}
        if len(files) != len(statement["predicate"]["resources"]):
            raise bad
        return files
    except (ValueError, KeyError, TypeError):
        raise bad from None


def _serialization_ok(serialization: dict[str, Any]) -> bool:
    return serialization.get("method") == "files" and serialization.get("hash_type") == "sha256" and \
        set(serialization.get("ignore_paths", [])) <= IGNORED
