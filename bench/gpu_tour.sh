#!/usr/bin/env bash
# The GPU tour without Docker (docs/gpu.md): a real Triton 2.51 taken from the nvidia-pytriton
# wheel, the dense MLP in PyTorch on the CPU, one GPU and two GPU instances with batching
# (scenarios/gpu-torch.yaml), measured by loadkit. Two halves:
#
#   bench/gpu_tour.sh pack   # here (network to PyPI): bench/.gpu-pack/, checked < 60 MiB
#   bench/gpu_tour.sh run    # on the GPU machine (no network): unpack, serve, measure
#
# The GPU machine has Python 3.12 with torch, onnxruntime, grpcio, numpy, pyyaml, matplotlib,
# uvloop and prometheus-client, and no Triton: the pack carries only what the server needs (its
# binary, libraries, the python backend, the 3.12 stub) plus the wheels loadkit lacks there.
# `run` works on a CPU-only host too (the GPU phases are then "skipped: no GPU"): that is the
# dry run made before a GPU machine is at hand (PYTHON=... picks the interpreter; the pack's
# stub must match its version, PYTRITON_DIR=... uses an installed wheel's server instead).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PACK="${PACK:-$ROOT/bench/.gpu-pack}"
PY_VERSION="${PY_VERSION:-3.12}"
LIMIT_MIB="${LIMIT_MIB:-60}"
# loadkit's runtime dependencies the GPU machine lacks (it has grpcio, numpy, pyyaml,
# matplotlib, uvloop, prometheus-client, torch); optuna and tokenizers are imported lazily
# (tune --strategy bayes, llm templates with a tokenizer) and are left out.
WHEELS=(locust "tritonclient[grpc]" "h2>=4.1,<5" hdrhistogram "protobuf>=5" python-rapidjson)
HAVE=(grpcio numpy pyyaml PyYAML matplotlib uvloop prometheus-client prometheus_client
      contourpy cycler fonttools kiwisolver packaging pillow pyparsing python-dateutil six)

pack() {
    local venv_py="$ROOT/.venv/bin/python"
    local site
    site="$("$venv_py" -c 'import pytriton, pathlib; print(pathlib.Path(pytriton.__file__).parent.parent)')"
    rm -rf "$PACK" && mkdir -p "$PACK/wheels"
    echo "packing Triton from $site ..."
    tar -C "$site" -cf - \
        pytriton/tritonserver/bin pytriton/tritonserver/backends pytriton/tritonserver/caches \
        "pytriton/tritonserver/python_backend_stubs/$PY_VERSION" nvidia_pytriton.libs \
        | xz -9 -T0 > "$PACK/triton.tar.xz"
    echo "downloading the wheels loadkit lacks there (cp${PY_VERSION/./}, manylinux) ..."
    "$venv_py" -m pip download -q --dest "$PACK/wheels" --only-binary=:all: \
        --python-version "$PY_VERSION" --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --platform linux_x86_64 --platform any "${WHEELS[@]}"
    for have in "${HAVE[@]}"; do  # the machine has these already: do not carry them
        rm -f "$PACK/wheels/${have//-/_}"-*.whl "$PACK/wheels/${have}"-*.whl
    done
    local mib
    mib=$(( $(du -sb "$PACK" | cut -f1) / 1048576 ))
    echo "pack: $mib MiB in $PACK ($(ls "$PACK/wheels" | wc -l) wheels)"
    if (( mib >= LIMIT_MIB )); then
        echo "pack is $mib MiB, over the ${LIMIT_MIB} MiB limit" >&2
        exit 1
    fi
}

run() {
    local python="${PYTHON:-python3}"
    local work="${WORK:-$(mktemp -d /tmp/loadkit-gpu-XXXXXX)}"
    local out="${OUT_DIR:-$ROOT/reports/gpu-torch-$(date -u +%Y%m%dT%H%M%SZ)}"
    local pytriton="${PYTRITON_DIR:-}"
    if [[ -z "$pytriton" ]]; then
        echo "unpacking Triton into $work ..."
        xz -dc "$PACK/triton.tar.xz" | tar -C "$work" -xf -
        pytriton="$work/pytriton"
        "$python" -m pip install -q --no-index --no-deps --target "$work/site" \
            "$PACK"/wheels/*.whl
        export PYTHONPATH="$ROOT:$work/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    local ver
    ver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    local server="$pytriton/tritonserver"
    local backends="$work/backends"
    mkdir -p "$backends"
    cp -r "$server/backends/python" "$backends/"
    cp "$server/python_backend_stubs/$ver/triton_python_backend_stub" "$backends/python/"
    local libs prefix
    libs="$(dirname "$pytriton")/nvidia_pytriton.libs"
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # the stub embeds libpython: in a virtualenv it imports that venv's packages only when
    # VIRTUAL_ENV and PATH name it (as the embedded server does, control/embedded.py)
    prefix="$("$python" -c 'import sys; print(sys.prefix if sys.prefix != sys.base_prefix else "")')"
    if [[ -n "$prefix" ]]; then
        export VIRTUAL_ENV="$prefix" PATH="$prefix/bin:$PATH"
    fi
    local port_http=18000 port_grpc=18001 port_metrics=18002
    local models=(--load-model=dense)
    if "$python" -c 'import torch' 2>/dev/null; then
        models+=(--load-model=dense_torch)
        scenario="$ROOT/scenarios/gpu-torch.yaml"
    else
        echo "torch is not importable by $python: measuring dense (numpy) only" >&2
        scenario="$ROOT/scenarios/quickstart.yaml"
    fi
    if [[ "$scenario" == *quickstart.yaml ]]; then
        models+=(--load-model=cnn)
    fi
    echo "starting tritonserver (logs: $work/tritonserver.log) ..."
    "$server/bin/tritonserver" --model-repository="$ROOT/model_repository" \
        --model-control-mode=explicit "${models[@]}" --backend-directory="$backends" \
        --http-address=127.0.0.1 --grpc-address=127.0.0.1 --metrics-address=127.0.0.1 \
        --http-port=$port_http --grpc-port=$port_grpc --metrics-port=$port_metrics \
        --allow-gpu-metrics=true --metrics-interval-ms=1000 --exit-timeout-secs=5 \
        > "$work/tritonserver.log" 2>&1 &
    SERVER_PID=$!
    trap 'kill "${SERVER_PID:-}" 2>/dev/null || true; wait "${SERVER_PID:-}" 2>/dev/null || true' EXIT
    local pid=$SERVER_PID
    for _ in $(seq 1 240); do  # a deadline, not a sleep: up to 120 s for the models to load
        if "$python" - "$port_http" <<'EOF' 2>/dev/null; then break; fi
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v2/health/ready", timeout=1)
EOF
        if ! kill -0 $pid 2>/dev/null; then
            echo "tritonserver exited; its log:" >&2; tail -30 "$work/tritonserver.log" >&2
            exit 1
        fi
        sleep 0.5
    done
    echo "measuring $scenario -> $out"
    local rc=0
    "$python" -m loadkit run "$scenario" --target "127.0.0.1:$port_grpc" \
        --metrics "http://127.0.0.1:$port_metrics/metrics" --out "$out" --quiet || rc=$?
    cp "$work/tritonserver.log" "$out/" || true
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv \
        > "$out/gpu.csv" || true
    return $rc
}

case "${1:-}" in
    pack) pack ;;
    run) run ;;
    *) echo "usage: $0 pack|run" >&2; exit 2 ;;
esac
