#!/usr/bin/env bash
# Install perf_analyzer (C++, from the tritonclient 2.34.0 wheel) into bench/.tools/, outside the
# project's venv (it is a different tritonclient). Its libb64 and libcudart.so.12 come from the
# nvidia-pytriton wheel already in the venv, so no apt-get and no CUDA install are needed.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=bench/.tools
PY=${PY:-.venv/bin/python}
if [ -x "$TOOLS/perf_analyzer" ] && [ -e "$TOOLS/lib/libcudart.so.12" ]; then exit 0; fi
mkdir -p "$TOOLS/lib"
"$PY" -m pip download -q --no-deps tritonclient==2.34.0 -d "$TOOLS/wheel"
"$PY" - "$TOOLS" <<'PY'
import glob, sys, zipfile
tools = sys.argv[1]
wheel = glob.glob(f"{tools}/wheel/tritonclient-2.34.0-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("tritonclient-2.34.0.data/data/bin/perf_analyzer")
with open(f"{tools}/perf_analyzer", "wb") as fh:
    fh.write(data)
PY
chmod +x "$TOOLS/perf_analyzer"
LIBS=$(ls -d .venv/lib/python3*/site-packages/nvidia_pytriton.libs | head -1)
ln -sf "$(realpath "$(ls "$LIBS"/libcudart-*.so.12* | head -1)")" "$TOOLS/lib/libcudart.so.12"
ln -sf "$(realpath "$(ls "$LIBS"/libb64-*.so.0d | head -1)")" "$TOOLS/lib/libb64.so.0d"
if LD_LIBRARY_PATH="$TOOLS/lib" ldd "$TOOLS/perf_analyzer" | grep -q "not found"; then
  LD_LIBRARY_PATH="$TOOLS/lib" ldd "$TOOLS/perf_analyzer" | grep "not found" >&2
  exit 1
fi
echo "perf_analyzer ready: $TOOLS/perf_analyzer"
