#!/usr/bin/env bash
# The CUDA checks, as one command for a machine with a GPU and no network (docs/validation.md, "On a GPU").
# Writes at most eight files to $OUT (default experiments/results/gpu; a relative OUT is taken from the
# repository root): steps.txt (the machine, then each step's exit status; the suite's is 1 when it
# misses its error targets), pytest_cuda.txt, tp.tgz (each TP plan's prediction, measurement and
# inputs, archived again as each plan ends), profiles.tgz (OPT-350M's layers measured on the GPU at
# fp32, tf32 and bf16, micro-batches 1 and 4: what experiments/profiles/gpu_layers.py compares with
# derived times), shared_gpu.md (experiments/validation/shared_gpu.py: host-staged transfers between
# ranks on the GPU), and the quick suite's validation_cuda_quick.{csv,md} and quick_inputs.tgz (each
# plan's prediction inputs and the command that predicts it again). The steps run most wanted first
# (the CUDA tests, tp2_gpt, the profiles, pp2_tp2_gpt, the transfer probe, the suite), each with a time
# limit, so that what finished comes back from a 10-minute call. Python packages the machine lacks
# (simpy at least) travel as wheels in .whl/ (see the docs). STEPS names the steps to run (default
# all: "pytest tp profiles probe quick"; a missing step's files are not written). DEVICE=cpu runs the
# same steps on CPU ranks (a check of this script; give it SCALE=4, which multiplies the time limits,
# and PROFILE_MODEL=mlp, a model CPUs profile in seconds).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-experiments/results/gpu}
DEVICE=${DEVICE:-cuda}
WAVES=${WAVES:-12}
SCALE=${SCALE:-1}
PROFILE_MODEL=${PROFILE_MODEL:-opt-350m}
STEPS=" ${STEPS:-pytest tp profiles probe quick} "
wanted() { [[ "$STEPS" == *" $1 "* ]]; }
mkdir -p "$OUT"
work=$(mktemp -d)
: >"$OUT/steps.txt"
failed=0
step() {                                      # step NAME SECONDS COMMAND...: run, time-limited, and record
    local name=$1 limit=$2; shift 2
    timeout "$((limit * SCALE))" "$@"
    local rc=$?
    echo "$name: exit $rc" >>"$OUT/steps.txt"
    [ "$rc" -eq 0 ] || failed=1
}
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1

{ date -u; nvidia-smi -L 2>&1; python3 -c "import torch; print('torch', torch.__version__, 'cuda',
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"; } >>"$OUT/steps.txt" 2>&1
cat "$OUT/steps.txt"

if wanted pytest; then
    step pytest_cuda 80 bash -c "python3 -m pytest -q -p no:cacheprovider tests/executor/test_exec_cuda.py >'$OUT/pytest_cuda.txt' 2>&1"
    tail -3 "$OUT/pytest_cuda.txt"
fi

# Tensor parallelism on the device: every rank shares this machine's GPU(s); the memory is the ranks' peak
# allocation (torch.cuda.max_memory_allocated) where they run on CUDA.
tp_plan() {
    local plan=$1 limit=$2
    step "$plan" "$limit" bash -c "set -o pipefail; python3 -m hetsim validate --plan experiments/validation/plans/$plan.json \
        --device '$DEVICE' --model-arg n_layer=2 --model-arg seq_len=128 --waves '$WAVES' --quiet \
        --out '$work/tp/$plan' | tee '$work/tp/$plan.txt'"
    tar czf "$OUT/tp.tgz" -C "$work" tp || failed=1
}
mkdir -p "$work/tp"
wanted tp && tp_plan tp2_gpt 100

# Layer times on the device at each precision, for the derived-time check (experiments/profiles/gpu_layers.py).
if wanted profiles; then
    mkdir -p "$work/profiles"
    for precision in fp32 tf32 bf16; do
        for batch in 1 4; do
            step "profile_${precision}_b$batch" 40 python3 -m hetsim profile --model "$PROFILE_MODEL" --batch "$batch" \
                --device "$DEVICE" --precision "$precision" --repeats 10 --warmup 3 --quiet \
                --out "$work/profiles/${PROFILE_MODEL}_b${batch}_$precision.yaml"
        done
    done
    tar czf "$OUT/profiles.tgz" -C "$work" profiles || failed=1
fi

wanted tp && tp_plan pp2_tp2_gpt 80

# What a host-staged transfer between ranks sharing the GPU holds, and its speed by message size.
wanted probe && step shared_gpu_probe 60 python3 experiments/validation/shared_gpu.py --device "$DEVICE" \
    --mib 32 --sizes 4,8,16,32 --out "$OUT/shared_gpu.md"

if wanted quick; then
    step quick_suite 180 python3 experiments/validation/run.py --device "$DEVICE" --quick --out "$work" \
        --stem validation_cuda_quick --inputs "$work/quick_inputs"
    cp "$work"/validation_cuda_quick.csv "$work"/validation_cuda_quick.md "$OUT"/ || failed=1
    tar czf "$OUT/quick_inputs.tgz" -C "$work" quick_inputs || failed=1
fi
cat "$OUT/steps.txt"
ls -l "$OUT"
exit "$failed"
