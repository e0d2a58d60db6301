"""The running sum of INPUT0 per sequence, 2 ms an execution (so that sequence slots, not the
CPU, bound the throughput); every request is appended to
$LOADKIT_RECORD_DIR/seq_record.log as `corrid start end value sum` (the server's record of
what it received, read by the tests)."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}
        folder = os.environ.get("LOADKIT_RECORD_DIR", "")
        path = os.path.join(folder, "seq_record.log")
        self.log = open(path, "a") if folder else None  # noqa: SIM115 (open while loaded)

    def execute(self, requests):
        time.sleep(0.002)
        responses = []
        lines = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().ravel()[0])
            end = int(pb_utils.get_input_tensor_by_name(request, "END").as_numpy().ravel()[0])
            key = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().ravel()[0])
            value = int(x.ravel()[0])
            total = (0 if start else self.sums.get(key, 0)) + value
            if end:
                self.sums.pop(key, None)
            else:
                self.sums[key] = total
            lines.append(f"{key} {start} {end} {value} {total}\n")
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", np.full(x.shape, total, dtype=np.int32))]))
        if self.log is not None:
            self.log.write("".join(lines))
            self.log.flush()
        return responses

    def finalize(self):
        if self.log is not None:
            self.log.close()
