"""Dense MLP served by Triton's python backend (numpy only).

Weights come from a fixed seed so every server computes the same function. The optional
`stall_every_s` / `stall_ms` parameters make the model pause periodically, which the open-loop
tests use to show coordinated omission; they are off in the shipped config.

`device_us` models an accelerator: every execute holds the "device" for that long whatever the
batch size (a sleep, so the shared CPU stays free for the client), the way a GPU kernel costs
about the same for 1 or 16 rows. Dynamic batching and instance groups then buy what they buy on
a GPU host; the optimization tour sets it, the shipped config leaves it at 0.

`error_every` makes every N-th execute fail all its requests with a server error (the tests of
loadkit's error reporting use it); off in the shipped config.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        rng = np.random.default_rng(20240601)
        self.w1 = (rng.standard_normal((256, 512)) / 16.0).astype(np.float32)
        self.w2 = (rng.standard_normal((512, 256)) / 22.6).astype(np.float32)
        self.stall_every_s = float(params.get("stall_every_s", "0"))
        self.stall_s = float(params.get("stall_ms", "0")) / 1000.0
        self.device_s = float(params.get("device_us", "0")) / 1e6
        self.next_stall = time.monotonic() + self.stall_every_s
        self.error_every = int(params.get("error_every", "0"))
        self.executes = 0
        # a slow load (as a TensorRT engine build is); the reload-timeout test sets it
        time.sleep(float(params.get("init_delay_s", "0")))
        pb_utils.Logger.log_info(f"dense: numpy {np.__version__} from {np.__file__}")

    def execute(self, requests):
        self.executes += 1
        if self.error_every and self.executes % self.error_every == 0:
            error = pb_utils.TritonError(f"dense: injected error (error_every={self.error_every})")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        if self.stall_every_s > 0 and time.monotonic() >= self.next_stall:
            time.sleep(self.stall_s)
            self.next_stall = time.monotonic() + self.stall_every_s
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        sizes = [x.shape[0] for x in xs]
        x = np.concatenate(xs) if len(xs) > 1 else xs[0]
        y = np.maximum(x @ self.w1, 0.0) @ self.w2
        if self.device_s > 0:
            time.sleep(self.device_s)
        responses = []
        start = 0
        for n in sizes:
            out = pb_utils.Tensor("OUTPUT0", y[start : start + n].astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            start += n
        return responses
