"""uint8 HWC -> float32 CHW in [-1, 1], per request batch."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "raw").as_numpy()
            image = raw.astype(np.float32).transpose(0, 3, 1, 2) / 127.5 - 1.0
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("image", np.ascontiguousarray(image))]))
        return responses
