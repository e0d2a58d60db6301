"""The running sum of INPUT0 per sequence, kept by correlation id; END forgets it."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            end = pb_utils.get_input_tensor_by_name(request, "END").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            out = np.zeros_like(x)
            for i in range(x.shape[0]):
                key = int(corrid[i].reshape(-1)[0])
                total = (0 if start[i].reshape(-1)[0] else self.sums.get(key, 0)) + int(x[i, 0])
                out[i, 0] = total
                if end[i].reshape(-1)[0]:
                    self.sums.pop(key, None)
                else:
                    self.sums[key] = total
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", out)]))
        return responses
