"""Write a bundle atomically: everything goes into a temporary folder that is renamed into place at the end."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import onnx

from mmtrt.backends.tensorrt.engines import ENGINE_DIR
from mmtrt.bundle.manifest import BUILD_REPORT, MANIFEST, dumps, is_bundle, sha256_file
from mmtrt.bundle.staging import (OWNER, claim, raise_if_terminated, signals_deferred, sigterm_as_interrupt,
                                  sweep_stale)
from mmtrt.bundle.stored import StoredTensors, digest, fresh_name, transpose_node
from mmtrt.errors import UserError
from mmtrt.ir import source_weights
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.proto import copy_fields
from mmtrt.progress import track


@contextlib.contextmanager
def staging_folder(out: Path, force: bool):
    """Yields a temporary folder beside `out`; on success it replaces `out`, on failure, Ctrl-C or SIGTERM it
    disappears. Staging folders that compiles killed harder (SIGKILL, a power cut) left are swept first."""
    out = Path(out).resolve()
    _check_replaceable(out, force)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(out.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise UserError(f"cannot write beside {out} ({exc}); choose another -o") from None
    with sigterm_as_interrupt():
        try:
            claim(tmp)
            yield tmp
            (tmp / OWNER).unlink()
            raise_if_terminated()
            with signals_deferred():
                _swap_into_place(tmp, out, force)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _check_replaceable(out: Path, force: bool, during: bool = False, look: Path | None = None) -> None:
    """--force replaces a bundle, never a folder of something else, nor a bundle with the user's files in it.
    `look`: where the folder named `out` is now (moved aside)."""
    look = out if look is None else look
    if not os.path.lexists(look):
        return
    if not force:
        when = "appeared during the compile (another compile's, or yours); the new bundle was discarded" if during \
            else "already exists"
        raise UserError(f"{out} {when}; pass --force to replace it or choose another -o")
    if not look.is_dir() or not is_bundle(look):
        raise UserError(f"{out} is not an mmtrt bundle (no {MANIFEST} of mmtrt's); --force replaces only bundles, "
                        "choose another -o")
    foreign = sorted(set(_bundle_files(look)) - set(_mmtrt_files(look)))
    if foreign:
        raise UserError(f"{out} holds files mmtrt did not write ({', '.join(foreign[:3])}); move them out or choose "
                        "another -o")


def _bundle_files(folder: Path) -> list[str]:
    return [p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()]


def _mmtrt_files(folder: Path) -> list[str]:
    """What a bundle folder holds: its manifest's artifacts, the manifest, the build report and built engines."""
    manifest = json.loads((folder / MANIFEST).read_text())
    listed = [*manifest["artifacts"], MANIFEST, BUILD_REPORT]
    return listed + [f for f in _bundle_files(folder) if f.startswith(f"{ENGINE_DIR}/")]


def _swap_into_place(tmp: Path, out: Path, force: bool) -> None:
    """Rename without replacing: whatever appeared at `out` during the compile (a folder the user made, another
    compile's bundle) is checked again here, and an old bundle is checked once more after it is moved aside, where
    nobody else can add to it; anything but a replaceable bundle goes back untouched."""
    if rename_noreplace(tmp, out):
        return
    _check_replaceable(out, force, during=True)
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    claim(old)
    aside = old / out.name
    os.rename(out, aside)
    try:
        _check_replaceable(out, force, during=True, look=aside)
        if not rename_noreplace(tmp, out):
            raise UserError(f"{out} appeared again while the old bundle was moved aside; choose another -o")
    except BaseException:
        if rename_noreplace(aside, out):
            shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def rename_noreplace(src: Path, dst: Path) -> bool:
    """Atomically rename `src` to `dst` unless `dst` exists (Linux renameat2 RENAME_NOREPLACE); False if it does.
    A plain rename would replace an empty folder at `dst` without a word. Where renameat2 is missing (another OS,
    a file system without it) the existence check and the rename are two steps."""
    libc = _libc()
    if libc is not None:
        if libc.renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        return False
    os.rename(src, dst)
    return True


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        return libc
    except (OSError, AttributeError):
        return None


def save_onnx(model: onnx.ModelProto, path: Path, threshold: int, stored: StoredTensors | None = None,
              table: bool = False, desc: str | None = None) -> list[str]:
    """Save with large initializers in one external data file; returns the file names it reads, the model's first.
    The files are `onnx.save_model(save_as_external_data=True, all_tensors_to_one_file=True)`'s to the byte, but
    written one initializer at a time from `model` (left as it was), a referenced weight a block at a time, so saving
    holds no second copy of the weights.
    With `stored` (the tensors saved so far beside `path`), an initializer already saved is read from there, and
    recorded there when it is new; `table`: `model`'s large tensors are token tables, shared with a tied lm_head.
    `desc`: a progress bar over the initializers under that name (widening a 7B LLM's takes minutes)."""
    data = f"{path.name}.data"
    shell = _without_initializers(model)
    taken = {t.name for t in model.graph.initializer} | {o for n in model.graph.node for o in n.output}
    inputs = {i.name for i in model.graph.input}
    taken |= inputs
    transposes, read = [], set()
    with contextlib.ExitStack() as files:
        sink = None
        initializers = model.graph.initializer
        for tensor in track(initializers, desc, len(initializers)) if desc else initializers:
            kept = shell.graph.initializer.add()
            raw = source_weights.tensor_data(tensor)
            if raw is None or len(raw) + _BYTES_OVERHEAD < threshold:
                kept.CopyFrom(tensor)
                if raw is not None and source_weights.is_reference(tensor):
                    source_weights.materialize_one(kept, source_weights.tensor_bytes(tensor))
                continue
            copy_fields(tensor, kept, skip="raw_data")
            del kept.external_data[:]
            kept.data_location = onnx.TensorProto.EXTERNAL
            sha = digest(raw) if stored else None
            entries = stored.same(tensor, raw, sha) if stored else None
            flipped = stored.transposed(tensor, raw) if stored and entries is None and tensor.name not in inputs \
                else None
            if flipped is not None:
                entries, dims = flipped
                kept.name = fresh_name(f"{tensor.name}.table", taken)
                kept.dims[:] = dims
                transposes.append(transpose_node(kept.name, tensor.name))
            if entries is not None:
                kept.external_data.extend(entries)
                read |= {e.value for e in entries if e.key == "location"}
                continue
            if sink is None:
                sink = files.enter_context(open(path.parent / data, "wb"))
            offset = sink.tell()
            for piece in source_weights.pieces(raw):
                sink.write(piece)
            sink.flush()
            for key, value in (("location", data), ("offset", offset), ("length", sink.tell() - offset)):
                kept.external_data.add(key=key, value=str(value))
            if stored:
                stored.add(kept, raw, sha, table)
            del raw
    if transposes:
        nodes = [*transposes, *shell.graph.node]
        del shell.graph.node[:]
        shell.graph.node.extend(nodes)
    onnx.save_model(shell, path)
    return [path.name, *([data] if sink is not None else []), *sorted(read - {data})]


# onnx's threshold compares sys.getsizeof(raw_data): the bytes object's header and its length
_BYTES_OVERHEAD = sys.getsizeof(b"")


def _without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    shell = onnx.ModelProto()
    copy_fields(model, shell, skip="graph")
    copy_fields(model.graph, shell.graph, skip="initializer")
    return shell


def write_artifacts(ir: ModelIR, folder: Path, threshold: int, stored: StoredTensors) -> dict[str, dict[str, Any]]:
    """Every component's artifact and the tokenizer assets, each tensor's bytes once (`stored`: the tensors saved
    into `folder`); returns where each component lives (its files: those it reads, other components' included)."""
    files = {}
    for comp in ir.components.values():
        if comp.onnx is not None:
            written = save_onnx(comp.onnx, folder / f"{comp.name}.onnx", threshold, stored, table=comp.name == "embed",
                                desc=f"writing {comp.name}")
        else:
            (folder / f"{comp.name}.json").write_text(dumps(comp.spec))
            written = [f"{comp.name}.json"]
        files[comp.name] = {"artifact": written[0], "files": written}
    for rel, content in sorted(ir.assets.items()):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(content)
    return files


def hash_artifacts(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in (MANIFEST, BUILD_REPORT, OWNER)}


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Hash every artifact into the manifest and write it."""
    manifest["artifacts"] = hash_artifacts(folder)
    (folder / MANIFEST).write_text(dumps(manifest))
    _make_readable(folder)


def write_build_report(folder: Path, build_report: dict[str, Any]) -> None:
    (folder / BUILD_REPORT).write_text(dumps(build_report))
    _make_readable(folder)


def _make_readable(folder: Path) -> None:
    """mkdtemp and ONNX's external data writer create owner-only files; a deployed bundle is read by others."""
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
