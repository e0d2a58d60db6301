"""docker-compose.yml and the GPU tour, checked structurally: no Docker engine or GPU runs here,
so what can be proven is that the files say what a GPU host needs and that loadkit accepts them."""

from __future__ import annotations

import yaml
from conftest import ROOT, loadkit

from loadkit.plan import build_plan
from loadkit.scenario import load_scenario


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
    accel = plan.phases[3].config["cnn"]["optimization"]["execution_accelerators"]
    assert accel["gpu_execution_accelerator"][0]["parameters"]["precision_mode"] == "FP16"
