"""Build model_repository/cnn/1/model.onnx: a small, standard CNN with fixed-seed weights.

Conv(3->16, 3x3) -> Relu -> MaxPool 2 -> Conv(16->32, 3x3) -> Relu -> GlobalAveragePool ->
Flatten -> Gemm(32->10). Only opset-13 core operators, so Triton's onnxruntime backend (and
TensorRT through it) can serve the same file. Deterministic: the same bytes on every run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 1234
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "model_repository/cnn/1/model.onnx"


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(SEED)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        data = rng.standard_normal(shape).astype(np.float32) / np.sqrt(fan_in)
        return numpy_helper.from_array(data, name)

    inits = [
        weight("conv1_w", 16, 3, 3, 3),
        numpy_helper.from_array(np.zeros(16, np.float32), "conv1_b"),
        weight("conv2_w", 32, 16, 3, 3),
        numpy_helper.from_array(np.zeros(32, np.float32), "conv2_b"),
        weight("fc_w", 10, 32),
        numpy_helper.from_array(np.zeros(10, np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv1_w", "conv1_b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2_w", "conv2_b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="loadkit"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    data = build().SerializeToString()
    outs = [args.out]
    if args.out == DEFAULT_OUT:  # cnn_ort serves the same file on the onnxruntime backend
        outs.append(DEFAULT_OUT.parent.parent.parent / "cnn_ort" / "1" / "model.onnx")
    for out in outs:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
