"""Channel means of a batch of 3x224x224 images: the input's bytes are the load."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "image").as_numpy()
            mean = x.mean(axis=(2, 3), dtype=np.float32).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("mean", mean)]))
        return responses
