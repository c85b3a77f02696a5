#!/usr/bin/env bash
# Every GPU check of issue 13 in one go, for a short lease on a GPU machine that cannot download anything:
#   benchmarks/gpu_all.sh OUTDIR [STAGES]
# STAGES (default "bench tests"): "bench" runs the GPU benchmarks, "tests" the suite's core on CuPy
# (FLOWLAB_DEVICE=gpu; the browser, notebook and dashboard tests need no GPU and are left to CI), "gpu" only the
# @pytest.mark.gpu tests. Wheels missing on the machine go in .whl/ (see benchmarks/README.md); each stage has its
# own time limit so that one hang cannot cost the others. Logs land in OUTDIR. The machine's NumPy is replaced by
# the carried one (CI's; pyproject pins < 2.3), which CuPy 14 and PyTorch 2.11 run with.
set -u
OUTDIR=${1:?usage: gpu_all.sh OUTDIR [STAGES]}
STAGES=${2:-bench tests}
mkdir -p "$OUTDIR"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    # into the interpreter's own environment, so that the tests' subprocesses find them too
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || export PYTHONPATH=$PWD
{
    date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    python3 -c "import sys, numpy, cupy, torch; print('python', sys.version.split()[0], 'numpy', numpy.__version__,
'cupy', cupy.__version__, 'CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(), 'torch', torch.__version__,
'torch CUDA', torch.version.cuda)"
} >> "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"

stage() {   # stage NAME SECONDS COMMAND...: run with a limit, log to OUTDIR/NAME.txt, say how it ended
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" > "$OUTDIR/$name.txt" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUTDIR/stages.txt"
}

CORE="tests/test_ops.py tests/test_grad.py tests/test_conv.py tests/test_job.py tests/test_compiler.py
      tests/test_watch.py tests/test_checkpoint.py tests/test_optimizers.py tests/test_health.py tests/test_health_log.py
      tests/test_summary_oneflow.py tests/test_summary_writer.py tests/test_seeds.py tests/test_multi_device.py
      tests/test_model_io.py tests/test_fast_paths.py tests/test_mnist_oneflow_hash.py tests/test_tutorial_programs.py
      tests/test_unittest_harness.py tests/test_data.py tests/test_graph_location.py tests/test_widgets.py
      tests/test_cuda_graph.py"
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE --tb=short --timeout 120"
for s in $STAGES; do
    case $s in
        gpu)   stage gpu-marked 120 env FLOWLAB_DEVICE=cpu $PYTEST -m gpu $CORE ;;
        bench)
            stage train_step 90 python3 benchmarks/train_step.py --device gpu --rounds 10
            stage watch_overhead 60 python3 benchmarks/watch_overhead.py --device gpu --rounds 12 --steps 50
            stage health 90 python3 benchmarks/health.py --device gpu --rounds 6 --steps 20
            stage health_per_call 60 python3 benchmarks/health.py --device gpu --per-call --net mlp --rounds 15 --steps 20
            stage gpu_steady 60 python3 benchmarks/gpu_steady.py --steps 50 ;;
        tests) stage tests 200 env FLOWLAB_DEVICE=gpu $PYTEST -n 12 $CORE ;;
        *) echo "unknown stage $s"; exit 2 ;;
    esac
done
tail -n 3 "$OUTDIR"/*.txt
