"""docker-compose.yml and the GPU tour, checked structurally: no Docker engine or GPU runs here,
so what can be proven is that the files say what a GPU host needs and that loadkit accepts them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from conftest import ROOT, loadkit

from loadkit.plan import build_plan
from loadkit.scenario import load_scenario


@pytest.mark.fast
def test_compose_serves_triton_with_gpu_explicit_control_and_runs_loadkit() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"triton", "loadkit", "locust-master", "locust-worker"} <= set(services)
    triton = services["triton"]
    assert triton["image"].startswith("nvcr.io/nvidia/tritonserver:")
    flags = triton["command"]
    assert flags[0] == "tritonserver"
    assert "--model-control-mode=explicit" in flags and "--model-repository=/models" in flags
    assert "./model_repository:/models" in triton["volumes"]
    assert all(p.startswith("127.0.0.1:") for p in triton["ports"])  # loopback unless chosen
    assert {p.split(":")[1] for p in triton["ports"]} == {"8000", "8001", "8002"}
    gpu = triton["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    runner = services["loadkit"]
    assert runner["command"][:2] == ["run", "scenarios/gpu-tour.yaml"]
    assert "--target=triton:8001" in runner["command"]
    assert runner["depends_on"]["triton"]["condition"] == "service_healthy"
    assert (ROOT / runner["command"][1]).is_file()
    assert "--master" in services["locust-master"]["command"]
    assert "--master-host=locust-master" in services["locust-worker"]["command"]
    assert all(p.startswith("127.0.0.1:") for p in services["locust-master"]["ports"])
    assert (ROOT / "Dockerfile").is_file()


def test_gpu_tour_validates_and_marks_its_gpu_and_plan_requirements() -> None:
    proc = loadkit("validate", "--offline", "scenarios/gpu-tour.yaml")
    assert proc.returncode == 0, proc.stderr
    plan = build_plan(load_scenario(ROOT / "scenarios/gpu-tour.yaml"))
    needs = {p.name: p.requires for p in plan.phases}
    assert not needs["ort-cpu"].gpu
    assert all(r.gpu for n, r in needs.items() if n != "ort-cpu")
    assert [f.name for f in needs["tensorrt-plan"].files] == ["model.plan"]
    accel = plan.phases[3].config["cnn_ort"]["optimization"]["execution_accelerators"]
    assert accel["gpu_execution_accelerator"][0]["parameters"]["precision_mode"] == "FP16"


def _k8s(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / name).read_text()) if d]


def _args(container: dict) -> list[str]:
    return [*container["command"], *container["args"]]


@pytest.mark.fast
def test_k8s_master_and_workers_run_the_same_image_scenario_and_port() -> None:
    """The manifests' commands are the ones the distributed tests run, wired to one Service."""
    from locust.argument_parser import parse_options

    master_dep, service = _k8s("master.yaml")
    (worker_dep,) = _k8s("workers.yaml")
    assert (master_dep["kind"], service["kind"], worker_dep["kind"]) == (
        "Deployment", "Service", "Deployment")
    master = master_dep["spec"]["template"]["spec"]["containers"][0]
    worker = worker_dep["spec"]["template"]["spec"]["containers"][0]
    assert master["image"] == worker["image"]
    env = lambda c: {e["name"]: e["value"] for e in c["env"]}  # noqa: E731
    assert env(master)["LOADKIT_SCENARIO"] == env(worker)["LOADKIT_SCENARIO"]
    assert (ROOT / env(master)["LOADKIT_SCENARIO"]).is_file()
    m = parse_options(_args(master)[1:])
    w = parse_options(_args(worker)[1:])
    assert m.master and w.worker and m.locustfile == w.locustfile == "locustfile.py"
    assert w.master_host == service["metadata"]["name"]
    assert master_dep["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert {p["port"] for p in service["spec"]["ports"]} >= {m.master_bind_port, m.web_port}
    assert w.master_port == m.master_bind_port
    assert service["spec"]["type"] == "ClusterIP"  # the UI is not exposed by default


@pytest.mark.fast
def test_k8s_headless_job_is_a_valid_loadkit_master_command() -> None:
    from loadkit.cli import build_parser

    job, service = _k8s("job-headless.yaml")
    run = job["spec"]["template"]["spec"]["containers"][0]
    assert run["command"] == ["loadkit"]
    args = build_parser().parse_args(run["args"])
    assert args.master and args.expect_workers >= 1 and args.target == "triton:8001"
    assert (ROOT / args.scenario).is_file()
    assert service["spec"]["selector"] == job["spec"]["template"]["metadata"]["labels"]
    assert {p["port"] for p in service["spec"]["ports"]} == {args.master_port}


# What the stock image (nvcr.io/nvidia/tritonserver:24.10-py3) provides to the models loaded at
# start, and where that is written down (docs/gpu.md has the same list):
# - backends: the NGC catalog's description of the xx.yy-py3 image ("Triton with support for
#   TensorFlow, PyTorch, TensorRT, ONNX and OpenVINO models", server issue #6806) plus the
#   python backend and Triton's built-in ensemble;
# - the python backend's Python packages: Triton's build.py (create_dockerfile_linux) installs
#   python3 with pip, numpy, wheel, setuptools and virtualenv for it, nothing else; torch,
#   tensorflow or onnxruntime are not there (server issues #4302, #5461).
NGC_BACKENDS = {"python", "onnxruntime", "tensorrt", "pytorch", "tensorflow", "openvino",
                "ensemble"}
NGC_PYTHON_MODULES = {"numpy", "triton_python_backend_utils", "setuptools", "wheel",
                      "virtualenv", "pip"}
PLATFORM_BACKEND = {"onnxruntime_onnx": "onnxruntime", "tensorrt_plan": "tensorrt",
                    "pytorch_libtorch": "pytorch", "tensorflow_savedmodel": "tensorflow",
                    "tensorflow_graphdef": "tensorflow", "ensemble": "ensemble"}


def image_lacks(model: str) -> list[str]:
    """What `model` (as model_repository/ has it) needs that the stock image does not have."""
    import sys

    from loadkit.control.embedded import model_imports
    from loadkit.modelconfig import from_pbtxt

    folder = ROOT / "model_repository" / model
    config = from_pbtxt((folder / "config.pbtxt").read_text())
    backend = config.get("backend") or PLATFORM_BACKEND.get(config.get("platform", ""), "?")
    if backend not in NGC_BACKENDS:
        return [f"backend {backend}"]
    if backend != "python":
        return []
    return sorted(f"python module {m}" for m in model_imports(folder)
                  if m not in sys.stdlib_module_names and m not in NGC_PYTHON_MODULES)


@pytest.mark.fast
def test_every_model_compose_loads_at_start_needs_only_what_the_stock_image_has() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    flags = compose["services"]["triton"]["command"]
    assert compose["services"]["triton"]["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"
    loaded = [f.split("=", 1)[1] for f in flags if f.startswith("--load-model=")]
    assert loaded == ["cnn_ort", "dense"]
    for model in loaded:
        assert image_lacks(model) == [], model
    # the check tells: the python-backend cnn (onnxruntime inside model.py) would not start
    assert image_lacks("cnn") == ["python module onnxruntime"]
    assert image_lacks("dense_torch") == ["python module torch"]
    # no Kubernetes manifest starts a Triton (they target the user's `triton` service)
    for path in (ROOT / "deploy" / "k8s").glob("*.yaml"):
        assert "tritonserver" not in path.read_text(), path
    # the GPU tour runs on the model the stock image can load
    tour = load_scenario(ROOT / "scenarios" / "gpu-tour.yaml")
    assert tour.models == ("cnn_ort",)
    assert (ROOT / "model_repository" / "cnn_ort" / "1" / "model.onnx").read_bytes() == (
        ROOT / "model_repository" / "cnn" / "1" / "model.onnx").read_bytes()


@pytest.mark.fast
def test_the_torch_model_runs_where_triton_puts_its_instance() -> None:
    text = (ROOT / "model_repository" / "dense_torch" / "1" / "model.py").read_text()
    assert 'args["model_instance_kind"] == "GPU"' in text
    assert "cuda:{args['model_instance_device_id']}" in text
    plan = build_plan(load_scenario(ROOT / "scenarios" / "gpu-torch.yaml"))
    assert [p.requires.gpu for p in plan.phases] == [False, True, True]


def test_the_torch_model_serves_the_dense_function(triton: Any, control: Any) -> None:
    """dense_torch on a CPU instance computes what `dense` does (same seeded weights); needs
    torch in the server's python, which this machine's test venv does not have."""
    pytest.importorskip("torch", reason="torch is not installed where the embedded Triton's "
                        "python backend runs (the GPU host script brings it)")
    import numpy as np
    import tritonclient.grpc as grpcclient

    from loadkit.modelconfig import from_pbtxt

    config = from_pbtxt((ROOT / "model_repository" / "dense_torch" / "config.pbtxt")
                        .read_text())
    config["instance_group"] = [{"count": 1, "kind": "KIND_CPU"}]
    control.load("dense_torch", config, 300)
    try:
        client = grpcclient.InferenceServerClient(triton.grpc_address)
        x = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)
        outs = []
        for model in ("dense", "dense_torch"):
            inp = grpcclient.InferInput("INPUT0", [2, 256], "FP32")
            inp.set_data_from_numpy(x)
            outs.append(client.infer(model, [inp]).as_numpy("OUTPUT0"))
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    finally:
        control.unload("dense_torch")


@pytest.mark.fast
def test_loadkit_serve_names_the_models_the_embedded_server_cannot_load() -> None:
    import importlib.util

    from loadkit.control.embedded import unservable

    repo = ROOT / "model_repository"
    assert "onnxruntime" in unservable(repo / "cnn_ort")
    assert unservable(repo / "dense") == unservable(repo / "cnn") == ""
    if importlib.util.find_spec("torch") is None:
        assert unservable(repo / "dense_torch") == "its model.py imports torch, not installed here"


def test_the_shipped_gpu_phases_skip_cleanly_on_a_host_without_a_gpu(
        triton: Any, tmp_path: Any) -> None:
    """scenarios/gpu-torch.yaml's phases, on `dense` (the numpy twin: torch is not here) with
    short steps: the CPU phase measures, both GPU phases are `skipped: no GPU`, the run is
    complete and exits 0, and the model is back on its config."""
    from conftest import results, write

    text = (ROOT / "scenarios" / "gpu-torch.yaml").read_text()
    text = text.replace("model: dense_torch", "model: dense").replace("dense_torch:", "dense:")
    text = text.replace('"4:32:x2", step_duration: 5s, warmup: 1s', "4, step_duration: 1s, "
                        "warmup: 0.2s")
    out = tmp_path / "gpu"
    proc = loadkit("run", str(write(tmp_path / "gpu.yaml", text)), "--target",
                   triton.grpc_address, "--metrics", triton.metrics_url, "--out", str(out),
                   "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = results(out)
    assert data["status"] == "complete"
    cpu, gpu, gpu2 = data["phases"]
    assert cpu["status"] == "ok" and cpu["steps"][0]["requests"] > 0
    for phase in (gpu, gpu2):
        assert phase["status"] == "skipped" and phase["reason"] == (
            "skipped: no GPU (the server's metrics report none)"), phase
    assert "skipped: no GPU" in (out / "summary.md").read_text()
