"""Streams IN's values back, one response each, DELAY_MS apart, then the final flag."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
            sender = request.get_response_sender()
            for v in values.reshape(-1):
                time.sleep(float(delay.reshape(-1)[0]) / 1000.0)
                out = pb_utils.Tensor("OUT", np.array([v], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
