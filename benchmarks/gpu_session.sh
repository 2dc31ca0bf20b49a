#!/usr/bin/env bash
# Every real-GPU test and GPU benchmark in one or two commands, for a lent GPU machine.
#
#   bash benchmarks/gpu_session.sh tests   # LPSIM_TEST_GPU=1 pytest over every file that touches CUDA
#   bash benchmarks/gpu_session.sh bench   # bench_quantize_gpu, bench_optim, bench_blocks
#   bash benchmarks/gpu_session.sh casgd   # bench_casgd with its roofline plot
#   bash benchmarks/gpu_session.sh profile # profile_cuda: host overhead, kernel resources, variants
#   bash benchmarks/gpu_session.sh probe   # probe_tensor_cores: what torch._scaled_mm returns
#   bash benchmarks/gpu_session.sh tests probe   # stages run in the order given
#
# Logs and JSON go to $OUT (or ./gpu-out).  Peers missing on the machine (gfloat, qtorch,
# torchao) are installed from wheels in .whl/ when that folder is there; so is numpy 2.4.6,
# which the lent machines need (their numpy 2.5 breaks numba-cuda 0.30.4).  To make .whl/:
#   echo /.whl/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
#     -d .whl numpy==2.4.6 gfloat more_itertools array-api-compat qtorch==0.3.0 torchao==0.18.0
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { cat "$OUT/install.log"; exit 1; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c 'import torch, numba, numba_cuda, numpy; print("torch", torch.__version__, "numba", numba.__version__, "numba-cuda", numba_cuda.__version__, "numpy", numpy.__version__)'
} >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

for stage in "${@:-tests}"; do
case $stage in
profile)
    python3 benchmarks/profile_cuda.py --sass "$OUT/round-kernel.sass" 2>&1 | tee "$OUT/profile.log"
    ;;
probe)
    python3 benchmarks/probe_tensor_cores.py --out "$OUT/tensor-cores.npz" 2>&1 | tail -40
    ;;
tests)
    files=$(grep -l -E "lpsim_cuda|cuda" tests/test_*.py | tr '\n' ' ')
    LPSIM_TEST_GPU=1 timeout "${TEST_BUDGET:-540}" python3 -m pytest -q -p no:cacheprovider \
        -n "${WORKERS:-6}" --dist loadfile --timeout 400 -rfE --junitxml="$OUT/tests.xml" \
        $files 2>&1 | tee "$OUT/tests.log" | tail -60
    ;;
bench)
    set -o pipefail
    R=$OUT
    { python3 benchmarks/bench_quantize_gpu.py --json "$R/quantize-gpu.json" 2>&1
      python3 benchmarks/bench_optim.py --device cuda --json "$R/optim-gpu.json" 2>&1
      python3 benchmarks/bench_blocks.py --device cuda --json "$R/blocks-gpu.json" 2>&1
      python3 benchmarks/bench_blocks.py --scaled-mm 2>&1
    } | tee "$R/bench.log"
    ;;
casgd)
    python3 benchmarks/bench_casgd.py --json "$OUT/casgd-gpu.json" --plot "$OUT/casgd-roofline.png" \
        2>&1 | tee "$OUT/casgd.log"
    ;;
esac
done
