"""docker-compose.yml and the GPU tour, checked structurally: no Docker engine or GPU runs here,
so what can be proven is that the files say what a GPU host needs and that loadkit accepts them."""

from __future__ import annotations

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
    accel = plan.phases[3].config["cnn"]["optimization"]["execution_accelerators"]
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
