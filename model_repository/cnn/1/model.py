"""ONNX CNN executed with onnxruntime inside Triton's python backend.

The graph file sits beside this one (model.onnx), so the same version folder also works with
Triton's onnxruntime backend on a GPU host.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(params.get("intra_op_threads", "1"))
        opts.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        pb_utils.Logger.log_info(f"cnn: onnxruntime {ort.__version__}, numpy {np.__version__}")

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "image").as_numpy() for r in requests]
        sizes = [x.shape[0] for x in xs]
        x = np.concatenate(xs) if len(xs) > 1 else xs[0]
        (y,) = self.session.run(["logits"], {"image": x})
        responses = []
        start = 0
        for n in sizes:
            out = pb_utils.Tensor("logits", y[start : start + n].astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            start += n
        return responses
