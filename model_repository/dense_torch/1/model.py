"""The dense MLP in PyTorch: on the GPU Triton assigns this instance (KIND_GPU), else the CPU.

Same seeded weights as `dense` (numpy's generator, so both compute the same function). Inputs
of all requests in a batch are stacked, moved to the device once, multiplied, and copied back:
what a real PyTorch model served by the python backend does.
"""

import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        json.loads(args["model_config"])  # validated by Triton; nothing here to read
        if args["model_instance_kind"] == "GPU":
            if not torch.cuda.is_available():
                raise pb_utils.TritonModelException(
                    "dense_torch: a KIND_GPU instance, but torch sees no CUDA device")
            self.device = torch.device(f"cuda:{args['model_instance_device_id']}")
        else:
            self.device = torch.device("cpu")
        rng = np.random.default_rng(20240601)
        w1 = (rng.standard_normal((256, 512)) / 16.0).astype(np.float32)
        w2 = (rng.standard_normal((512, 256)) / 22.6).astype(np.float32)
        self.w1 = torch.from_numpy(w1).to(self.device)
        self.w2 = torch.from_numpy(w2).to(self.device)
        pb_utils.Logger.log_info(f"dense_torch: torch {torch.__version__} on {self.device}")

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        sizes = [x.shape[0] for x in xs]
        x = torch.from_numpy(np.concatenate(xs) if len(xs) > 1 else xs[0]).to(self.device)
        with torch.inference_mode():
            y = (torch.relu(x @ self.w1) @ self.w2).cpu().numpy()
        responses = []
        start = 0
        for n in sizes:
            out = pb_utils.Tensor("OUTPUT0", y[start:start + n].astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            start += n
        return responses
