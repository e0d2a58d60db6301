"""Bag-of-words text classification: lowercase, split on whitespace, hash each word into one
of 256 buckets, a fixed (seeded) linear layer, softmax. Work grows with the text's length."""

import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

BUCKETS = 256
LABELS = [b"sports", b"science", b"politics", b"arts"]


class TritonPythonModel:
    def initialize(self, args):
        self.weights = np.random.default_rng(7).normal(size=(BUCKETS, len(LABELS)))

    def _features(self, text: bytes) -> np.ndarray:
        x = np.zeros(BUCKETS, dtype=np.float64)
        for word in text.lower().split():
            x[zlib.crc32(word) % BUCKETS] += 1.0
        return x

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            feats = np.stack([self._features(t.reshape(-1)[0]) for t in texts])
            logits = feats @ self.weights
            scores = np.exp(logits - logits.max(axis=1, keepdims=True))
            scores /= scores.sum(axis=1, keepdims=True)
            labels = np.array([[LABELS[i]] for i in scores.argmax(axis=1)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("LABEL", labels),
                pb_utils.Tensor("SCORES", scores.astype(np.float32)),
            ]))
        return responses
