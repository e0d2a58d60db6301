"""A simulated LLM (decoupled): prefill, then one token per decode step, streamed.

Per execute() (a batch of requests): prefill sleeps prefill_us_per_token for every input token
of the batch (whitespace-separated words), then each request gets its first token; each further
decode step sleeps decode_us_per_step + decode_us_per_sequence x (requests still generating) and
gives every one of them its next token. The last token goes with the final flag, so a request
with max_tokens = n (TensorRT-LLM's input, or the vLLM backend's sampling_parameters JSON)
gets exactly n responses. A request the client cancels gets no more responses. Request parameters `prefill_us_per_token` and `decode_us_per_step`
override the config's for that request (a decode step takes the slowest in the batch). With stream = false the tokens are joined into one
final response, as the vLLM backend does.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})

        def p(key, default):
            return float(params.get(key, {}).get("string_value", default))

        self.prefill_s = p("prefill_us_per_token", 50) / 1e6
        self.step_s = p("decode_us_per_step", 2000) / 1e6
        self.per_seq_s = p("decode_us_per_sequence", 100) / 1e6
        self.default_max = int(p("default_max_tokens", 16))

    def execute(self, requests):
        live = []
        prefill_s = 0.0
        step_s, per_seq_s = self.step_s, self.per_seq_s
        for request in requests:
            # a request parameter may set this request's clock (tests compare two clocks on one
            # loaded model); a decode step is the batch's, so it takes the slowest asked for
            own = json.loads(request.parameters() or "{}")
            step_s = max(step_s, float(own.get("decode_us_per_step", 0)) / 1e6)
            text = _scalar(request, "text_input", b"")
            text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
            prefill_s += len(text.split()) * float(
                own.get("prefill_us_per_token", self.prefill_s * 1e6)) / 1e6
            wanted = int(_scalar(request, "max_tokens", self.default_max))
            sampling = _scalar(request, "sampling_parameters", b"")
            if sampling:  # the vLLM backend's spelling: {"max_tokens": N, ...}
                wanted = int(json.loads(sampling).get("max_tokens", wanted))
            stream = bool(_scalar(request, "stream", True))
            keep_input = not bool(_scalar(request, "exclude_input_in_output", False))
            live.append({"sender": request.get_response_sender(), "left": max(1, wanted),
                         "n": 0, "stream": stream, "words": [text] if keep_input else []})
        time.sleep(prefill_s)
        while live:
            for seq in live:
                if seq["sender"].is_cancelled():  # the client cancelled: end it, send no more
                    seq["sender"].send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    seq["left"] = 0
                    continue
                seq["n"] += 1
                seq["left"] -= 1
                token = f" tok{seq['n']}"
                final = seq["left"] == 0
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
                if seq["stream"]:
                    self._send(seq["sender"], token, flags)
                else:
                    seq["words"].append(token)
                    if final:
                        self._send(seq["sender"], "".join(seq["words"]), flags)
            live = [s for s in live if s["left"] > 0]
            if live:
                time.sleep(step_s + per_seq_s * len(live))
        return None

    @staticmethod
    def _send(sender, text, flags):
        out = pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))
        sender.send(pb_utils.InferenceResponse(output_tensors=[out]), flags=flags)
