"""`mmtrt sign` / `mmtrt verify --public-key` through OpenSSF model-signing, and the Python runtime requiring the
signature at load (`load(path, public_key=...)`): a changed bundle, another key or no signature is one line."""

import json
import shutil

import pytest

from mmtrt.bundle.manifest import sha256_file
from mmtrt.cli import main
from mmtrt.errors import UserError
from mmtrt.runtime import load


def key_pair(folder, name, curve="ec"):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    key = ec.generate_private_key(ec.SECP384R1()) if curve == "ec" else rsa.generate_private_key(65537, 2048)
    (folder / f"{name}.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    (folder / f"{name}.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                       serialization.PublicFormat.SubjectPublicKeyInfo))
    return folder / f"{name}.pem", folder / f"{name}.pub"


def one_line(capsys, argv, *words):
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_sign_verify_and_load(tiny_bundle, tmp_path, capsys):
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    key, pub = key_pair(tmp_path, "signer")
    _, other = key_pair(tmp_path, "other")
    assert main(["sign", str(bundle), "--key", str(key)]) == 0
    digest = sha256_file(bundle / "manifest.json")
    assert f"sha256:{digest}" in capsys.readouterr().out
    assert main(["verify", str(bundle), "--public-key", str(pub)]) == 0
    assert load(bundle, public_key=pub, expect_digest=digest).hash == digest
    with pytest.raises(UserError, match="does not verify with"):
        load(bundle, public_key=other)
    (bundle / "engines").mkdir()  # built later on the host: not signed, not refused
    (bundle / "engines" / "index.json").write_text("{}")
    assert main(["verify", str(bundle), "--public-key", str(pub)]) == 0

    tokenizer = bundle / "tokenizer" / "tokenizer_config.json"
    tokenizer.write_text(tokenizer.read_text().replace("<pad>", "<pad2>"))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["artifacts"]["tokenizer/tokenizer_config.json"] = sha256_file(tokenizer)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="manifest.json differs from what its signature covers"):
        load(bundle, public_key=pub)
    one_line(capsys, ["verify", bundle, "--public-key", pub], "fails its signature check")


def test_bad_keys_and_unsigned_bundles(tiny_bundle, tmp_path, capsys):
    _, pub = key_pair(tmp_path, "signer")
    rsa_key, rsa_pub = key_pair(tmp_path, "rsa", curve="rsa")
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    one_line(capsys, ["sign", bundle, "--key", tmp_path / "none.pem"], "none.pem does not exist")
    one_line(capsys, ["sign", bundle, "--key", rsa_key], "cannot sign with")
    assert not (bundle / "model.sig").exists()
    with pytest.raises(UserError, match="is not signed"):
        load(bundle, public_key=pub)
    with pytest.raises(UserError, match="not an elliptic-curve key"):
        (bundle / "model.sig").write_text("{}")
        load(bundle, public_key=rsa_pub)
    with pytest.raises(UserError, match="is not a model-signing signature"):
        load(bundle, public_key=pub)
