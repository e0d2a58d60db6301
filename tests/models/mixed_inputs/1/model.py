"""Per row: the sum of IDS and SCALE plus the length of TEXT; refuses a request whose inputs
are not of the declared dtypes (so a test sees a wrong fill as a failure, not a number)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            ids = pb_utils.get_input_tensor_by_name(request, "IDS").as_numpy()
            scale = pb_utils.get_input_tensor_by_name(request, "SCALE").as_numpy()
            if ids.dtype != np.int64 or scale.dtype != np.float16 or text.dtype != object:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"unexpected dtypes {text.dtype} {ids.dtype} {scale.dtype}")))
                continue
            lengths = np.array([[len(t) for t in row] for row in text], dtype=np.float32)
            total = (ids.sum(axis=1, dtype=np.float64) + scale.astype(np.float64).sum(axis=1))
            out = (total[:, None] + lengths.sum(axis=1, keepdims=True)).astype(np.float32)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("SUM", out)]))
        return responses
