"""The Triton model's interface, the same under `mmtrt serve` (PyTriton) and in an exported model repository.

Input `request`: one BYTES element, the JSON of an OpenAI chat completion body (`model` may be left out; `stream`
is ignored: responses always stream). The model is decoupled: every decode step is one response with
`token_ids` (the step's new tokens), `text` (the text they add), `finish_reason` (empty until the last response:
stop, length or abort) and `error` (empty, or one line naming the problem, with finish_reason "error", for a bad
request or a full queue); then the final flag.
"""

from __future__ import annotations

import numpy as np

INPUTS = (("request", np.object_, (1,)),)
OUTPUTS = (("token_ids", np.int64, (-1,)), ("text", np.object_, (1,)), ("finish_reason", np.object_, (1,)),
           ("error", np.object_, (1,)))
PBTXT_TYPES = {np.object_: "TYPE_STRING", np.int64: "TYPE_INT64"}


def response(token_ids=(), text: str = "", finish_reason: str | None = None, error: str | None = None) -> dict:
    """One response's tensors."""
    return {"token_ids": np.asarray(token_ids, np.int64).reshape(-1),
            "text": np.array([text.encode()], np.object_),
            "finish_reason": np.array([(finish_reason or "").encode()], np.object_),
            "error": np.array([(error or "").encode()], np.object_)}


def pbtxt_tensors(kind: str, tensors) -> str:
    rows = [f'  {{ name: "{name}" data_type: {PBTXT_TYPES[dtype]} dims: [ {", ".join(map(str, shape))} ] }}'
            for name, dtype, shape in tensors]
    return f"{kind} [\n" + ",\n".join(rows) + "\n]\n"
