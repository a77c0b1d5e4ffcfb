"""An mmtrt bundle as a Triton Python backend model (decoupled): copied into an exported model repository as
`<model>/1/model.py`, beside the bundle in `<model>/1/bundle`. Never imported by mmtrt.

It imports nothing of mmtrt: the backend's stub runs it in the server's own Python environment (whatever numpy
and Python version that has), and it starts mmtrt's serving loop as a worker process of the Python that exported
it (config parameter `mmtrt_python`; the environment variable MMTRT_PYTHON wins), speaking JSON lines. The
interface is mmtrt.serve.triton_io's: input `request` (the JSON of a chat completion body), outputs `token_ids`,
`text`, `finish_reason`, `error`, one response per decode step.
"""

import itertools
import json
import os
import subprocess
import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"]
        command = [os.environ.get("MMTRT_PYTHON") or params["mmtrt_python"], "-m", "mmtrt.serve.worker",
                   str(folder / "bundle"), "--name", args["model_name"], "--max-queue", params["max_queue"]]
        command += ["--max-batch", params["max_batch"]] if params.get("max_batch") else []
        command += ["--allow-images", params["allow_images"]] if params.get("allow_images") else []
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME")}
        self.worker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       bufsize=1, env=env)
        ready = self.worker.stdout.readline()
        if not ready or not json.loads(ready).get("ready"):
            raise pb_utils.TritonModelException(f"the mmtrt worker did not start: {' '.join(command)}")
        self.senders, self.ids, self.lock = {}, itertools.count(), threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def execute(self, requests):
        for request in requests:
            rid = str(next(self.ids))
            body = pb_utils.get_input_tensor_by_name(request, "request").as_numpy().reshape(-1)[0]
            with self.lock:
                self.senders[rid] = request.get_response_sender()
            self._write({"id": rid, "body": body.decode() if isinstance(body, bytes) else str(body)})
        return None

    def finalize(self):
        """End of input drains the worker: running requests finish first."""
        self.worker.stdin.close()
        self.worker.wait(timeout=120)
        self.reader.join(timeout=10)

    def _write(self, message):
        with self.lock:
            self.worker.stdin.write(json.dumps(message) + "\n")
            self.worker.stdin.flush()

    def _read(self):
        for line in self.worker.stdout:
            message = json.loads(line)
            with self.lock:
                sender = self.senders.get(message["id"])
            if sender is None:
                continue
            if getattr(sender, "is_cancelled", lambda: False)() and not message["finish_reason"]:
                self._write({"id": message["id"], "cancel": True})  # the client went away: free its KV blocks
                continue
            sender.send(_response(message))
            if message["finish_reason"]:  # then the final flag alone, as PyTriton sends it under `mmtrt serve`
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                with self.lock:
                    self.senders.pop(message["id"], None)


def _response(message):
    def text(value):
        return np.array([(value or "").encode()], dtype=np.object_)

    return pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor("token_ids", np.asarray(message["token_ids"], dtype=np.int64).reshape(-1)),
        pb_utils.Tensor("text", text(message["text"])),
        pb_utils.Tensor("finish_reason", text(message["finish_reason"])),
        pb_utils.Tensor("error", text(message["error"]))])
