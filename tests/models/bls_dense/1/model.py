"""Calls `dense` with its input and returns dense's output (business logic scripting)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            call = pb_utils.InferenceRequest(model_name="dense", inputs=[x],
                                             requested_output_names=["OUTPUT0"])
            reply = call.exec()
            if reply.has_error():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(reply.error().message())))
                continue
            out = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
