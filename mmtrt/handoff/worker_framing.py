"""The framing an engine worker and mmtrt speak over the worker's stdin and stdout, both ways: a 4-byte big-endian
length, a JSON header of that length, then the raw bytes of the arrays the header lists under "arrays"
([name, dtype, shape] each, in order). Standard library only (numpy when arrays come), so a worker started as a
script in an engine's own environment imports it beside itself, without mmtrt."""

import json
import struct


def write_message(stream, header: dict, arrays: dict | None = None) -> None:
    arrays = arrays or {}
    header = {**header, "arrays": [[name, str(a.dtype), list(a.shape)] for name, a in arrays.items()]}
    text = json.dumps(header).encode()
    stream.write(struct.pack(">I", len(text)) + text)
    for a in arrays.values():
        stream.write(a.tobytes(order="C"))
    stream.flush()


def read_message(stream) -> tuple[dict, dict]:
    """The next header and its arrays; EOFError when the other side has closed the pipe."""
    size = _exactly(stream, 4)
    header = json.loads(_exactly(stream, struct.unpack(">I", size)[0]))
    arrays = {}
    if header["arrays"]:
        import numpy as np

        for name, dtype, shape in header["arrays"]:
            count = int(np.prod(shape, dtype=np.int64))
            arrays[name] = np.frombuffer(_exactly(stream, count * np.dtype(dtype).itemsize), dtype).reshape(shape)
    return header, arrays


def _exactly(stream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError("the pipe closed mid-message" if data else "the pipe closed")
        data += chunk
    return data
