"""Every load checks every artifact against the manifest: a changed or missing file is refused, naming it; an
unchanged bundle is recognised by file identity without rehashing, yet a write with its mtime set back is caught."""

import os
import shutil

import pytest

from mmtrt.bundle import verify
from mmtrt.bundle.manifest import read_manifest
from mmtrt.cli import main
from mmtrt.errors import UserError
from mmtrt.runtime import load


@pytest.fixture
def bundle(tiny_bundle, tmp_path):
    return shutil.copytree(tiny_bundle, tmp_path / "copy.bundle")


@pytest.fixture
def hashes(monkeypatch):
    """The names of the files verify hashes."""
    seen = []
    real = verify.sha256_file

    def counting(path):
        seen.append(path.name)
        return real(path)

    monkeypatch.setattr(verify, "sha256_file", counting)
    return seen


def flip_byte(path, offset=1000, keep_mtime=False):
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_flipped_byte_is_refused_naming_the_file(bundle):
    flip_byte(bundle / "llm.onnx.data")
    with pytest.raises(UserError, match=r"llm\.onnx\.data changed since compile"):
        load(bundle)


def test_a_deleted_file_is_refused_naming_the_file(bundle):
    (bundle / "llm.onnx.data").unlink()
    with pytest.raises(UserError, match=r"llm\.onnx\.data missing"):
        load(bundle)


def test_an_unchanged_bundle_is_hashed_once_then_known_by_identity(bundle, hashes):
    manifest = read_manifest(bundle)
    verify.verify_bundle(bundle, manifest)
    assert sorted(hashes) == sorted(os.path.basename(n) for n in manifest["artifacts"])
    hashes.clear()
    verify.verify_bundle(bundle, manifest)
    assert hashes == []
    verify.verify_bundle(bundle, manifest, full=True)
    assert len(hashes) == len(manifest["artifacts"])


def test_a_change_with_the_mtime_set_back_is_still_caught(bundle, hashes):
    manifest = read_manifest(bundle)
    verify.verify_bundle(bundle, manifest)
    hashes.clear()
    flip_byte(bundle / "vision.onnx.data", keep_mtime=True)
    with pytest.raises(UserError, match=r"vision\.onnx\.data changed"):
        verify.verify_bundle(bundle, manifest)
    assert hashes == ["vision.onnx.data"]


def test_a_changed_file_stays_refused_on_later_loads(bundle):
    manifest = read_manifest(bundle)
    flip_byte(bundle / "embed.onnx.data")
    for _ in range(2):
        with pytest.raises(UserError, match="embed.onnx.data"):
            verify.verify_bundle(bundle, manifest)


def test_an_artifact_outside_the_bundle_is_refused(bundle):
    manifest = read_manifest(bundle)
    manifest["artifacts"]["../outside"] = "0" * 64
    with pytest.raises(UserError, match="outside the bundle"):
        verify.verify_bundle(bundle, manifest)


def test_an_unwritable_cache_only_costs_the_full_hash(bundle, hashes, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("MMTRT_CACHE", str(blocker))
    manifest = read_manifest(bundle)
    for _ in range(2):
        verify.verify_bundle(bundle, manifest)
    assert len(hashes) == 2 * len(manifest["artifacts"])


def test_verify_command_and_compare_refuse_a_changed_bundle(bundle, tiny_bundle, capsys):
    assert main(["verify", str(bundle)]) == 0
    flip_byte(bundle / "tokenizer" / "tokenizer.json", offset=10)
    assert main(["verify", str(bundle)]) == 2
    assert "tokenizer/tokenizer.json changed" in capsys.readouterr().err
    assert main(["compare", str(tiny_bundle), str(bundle), "--partition", "embed"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tokenizer/tokenizer.json" in err, err
