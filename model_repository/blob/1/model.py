"""OUTPUT0 = SIZE bytes of a repeating pattern."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy().reshape(-1)[0])
            out = (np.arange(size) % 251).astype(np.uint8)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", out)]))
        return responses
