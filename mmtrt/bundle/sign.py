"""`mmtrt sign` and `mmtrt verify --public-key`: OpenSSF model-signing with an elliptic-curve private key, offline.

The signature (`model.sig`, a Sigstore bundle) covers every file of the bundle, manifest.json included, except
what is built or recorded later on the host: `engines/` and `build_report.json`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mmtrt.bundle.manifest import read_manifest
from mmtrt.bundle.schema import SIGNATURE, check_schema
from mmtrt.bundle.trust import IGNORED, manifest_digest
from mmtrt.bundle.verify import verify_bundle
from mmtrt.errors import UserError


def _model_signing():
    try:
        import model_signing
    except ImportError as exc:
        raise UserError(f"signing needs OpenSSF's model-signing ({exc}); pip install 'mmtrt[sign]'") from None
    return model_signing


def sign_bundle(bundle: Path, key: Path, password: str | None = None) -> str:
    """Sign a bundle that checks out (schema, every artifact hashed in full); returns its digest."""
    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    check_schema(bundle, manifest)
    verify_bundle(bundle, manifest, full=True)
    if not Path(key).is_file():
        raise UserError(f"private key {key} does not exist; pass a PEM elliptic-curve key (openssl ecparam -genkey)")
    _check_private_key(Path(key), password)
    ms = _model_signing()
    hashing = ms.hashing.Config().set_ignored_paths(paths=sorted(IGNORED), ignore_git_paths=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{SIGNATURE}.", dir=bundle.parent)
    os.close(fd)
    try:
        ms.signing.Config().use_elliptic_key_signer(private_key=key, password=password) \
            .set_hashing_config(hashing).sign(bundle, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, bundle / SIGNATURE)
    except (ValueError, TypeError) as exc:
        raise UserError(f"cannot sign with {key} ({_first_line(exc)}); pass an unencrypted PEM elliptic-curve "
                        "private key on P-256, P-384 or P-521, or its --password") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return manifest_digest(bundle)


def _check_private_key(key: Path, password: str | None) -> None:
    """model-signing signs with P-256, P-384 or P-521 keys and fails on others with an AttributeError."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        private = serialization.load_pem_private_key(key.read_bytes(), password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        raise UserError(f"cannot sign with {key} ({_first_line(exc)}); pass a PEM elliptic-curve private key, and "
                        "its password in MMTRT_SIGNING_PASSWORD if it is encrypted") from None
    if not isinstance(private, ec.EllipticCurvePrivateKey) or private.curve.name not in ("secp256r1", "secp384r1",
                                                                                       "secp521r1"):
        raise UserError(f"cannot sign with {key}: model-signing takes elliptic-curve keys on P-256, P-384 or P-521 "
                        "(openssl ecparam -name prime256v1 -genkey -noout -out key.pem)")


def verify_signature(bundle: Path, public_key: Path) -> None:
    """model-signing's own verifier: the signature, then every byte of every file against it."""
    bundle = Path(bundle)
    if not (bundle / SIGNATURE).is_file():
        raise UserError(f"bundle {bundle} is not signed (no {SIGNATURE}); sign it with `mmtrt sign`")
    if not Path(public_key).is_file():
        raise UserError(f"public key {public_key} does not exist; pass the signer's PEM public key")
    ms = _model_signing()
    try:
        ms.verifying.Config().use_elliptic_key_verifier(public_key=public_key) \
            .verify(bundle, bundle / SIGNATURE)
    except Exception as exc:  # model-signing reports every failure as one of several exception types
        raise UserError(f"bundle {bundle} fails its signature check with {public_key} ({_first_line(exc)}); it was "
                        "changed after signing or another key signed it") from None


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
