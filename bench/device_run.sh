#!/usr/bin/env bash
# One run on a GPU machine without internet: install carried wheels and fastpath (editable, its
# extension built there), then the GPU tests and the given benches, logging everything under $OUT.
#
#   bench/device_run.sh [tests|nopdl-tests|kernel-tests|mma-tests|mlp-block-tests|tp-tests|attention-tests|sampling-tests|sampler-tests|prefill-graph-tests|prefix-tests|lora-tests|pooling-tests|bf16-tests|quick-tests] [ab-step|ab-mlp-block|ab-lines|mlp-block|ab-mma|ab-mma-rope|ab-gated|ab-early-kv|ab-early-rope|ab-rope|ab-gemv|linear|decode-greedy|decode|decode-18|decode-generated|guided-threads|guided-3|decode-quick|decode-fused|decode-sampling|tp-decode|tp-decode-1b|tp-decode-8b|tp-two-shot|allreduce|prefill|prefix-cache|lora|sampler|profile|profile-general|host-profile|host-phases|step-timeline|step-timeline-pdl|serve|serve-64|serve-1024|serve-ab|serve-final|serve-gil|serve-env|serve-phases|serve-check|serve-interval|serve-api-servers|serve-512|guided|hostdispatch ...]
#
# Wheels for what the machine lacks (pydantic, xgrammar, ...) travel in .whl/ (see docs/performance.md).
# sampler: SAMPLER_VARIANTS="CHUNKxBLOCKxWARPS ..." and SAMPLER_ARGS="--batch 8 64 256 ..." pick its rows.
set -uo pipefail
# Steps write into $WORK; at the end everything but the bench tokenizer goes back as one archive
# (the device tool returns at most 8 files).
FINAL=${OUT:-out}
OUT=${WORK:-/tmp/device-work}  # two runs side by side (one a GPU) each name their own
mkdir -p "$OUT" "$FINAL"
log="$OUT/device.log"
start=$(date +%s)
stamp() { echo "=== $1 $(( $(date +%s) - start )) s" | tee -a "$log"; }

if ls .whl/*.whl >/dev/null 2>&1; then
  [ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# SKIP_INSTALL=1: an earlier run on this machine installed; two side-by-side runs must not both build.
if [ -z "${SKIP_INSTALL:-}" ]; then
  python3 -m pip install -q --no-build-isolation --no-deps -e . >>"$log" 2>&1 || { echo "install failed" | tee -a "$log"; tail -30 "$log"; exit 1; }
  stamp install
fi
export FASTPATH_PROGRESS=0 PYTHONUNBUFFERED=1

for step in "$@"; do
  case "$step" in
    # A test hung in C++ ends the run after 120 s with every thread's stack (pytest-timeout, thread method).
    # nopdl-tests: the same suite with programmatic dependent launch off (on by default since round 11).
    tests|nopdl-tests) pdl=$([ "$step" = nopdl-tests ] && echo 0 || echo 1); suffix=$([ "$pdl" = 0 ] && echo _nopdl)
      FASTPATH_PDL=$pdl timeout 480 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 120 --timeout-method thread tests 2>&1 | tee "$OUT/gpu_tests$suffix.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Fatal|Timeout" | tail -80 ;;
    tp-tests) timeout 400 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 120 --timeout-method thread tests/runtime/test_gpu_tensor_parallel.py 2>&1 | tee "$OUT/gpu_tp_tests.log" | grep --line-buffered -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Fatal|^E " ;;
    attention-tests) timeout 300 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 120 --timeout-method thread tests/runtime/test_gpu_runtime.py -k "triton or graph or mixed" 2>&1 | tee "$OUT/gpu_attention_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -30 ;;
    sampling-tests) timeout 300 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 120 --timeout-method thread tests/runtime/test_gpu_sampling.py 2>&1 | tee "$OUT/gpu_sampling_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -20 ;;
    sampler-tests)  # the general sampler's kernels, in graphs and guided graphs (its PDL edges included)
      timeout 400 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 150 --timeout-method thread tests/runtime/test_gpu_sampling.py \
        tests/runtime/test_gpu_guided.py tests/runtime/test_guided_gpu.py 2>&1 | tee "$OUT/gpu_sampler_tests.log" | grep -E "FAILED|ERROR|passed|failed|^E " | tail -20 ;;
    prefix-tests) timeout 200 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 120 --timeout-method thread tests/runtime/test_gpu_prefix_cache.py tests/runtime/test_gpu_sampling.py 2>&1 | tee "$OUT/gpu_prefix_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -20 ;;
    lora-tests) timeout 240 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 150 --timeout-method thread tests/runtime/test_gpu_lora.py 2>&1 | tee "$OUT/gpu_lora_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -20 ;;
    pooling-tests) timeout 240 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 150 --timeout-method thread tests/runtime/test_gpu_pooling.py 2>&1 | tee "$OUT/gpu_pooling_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -20 ;;
    prefill-graph-tests) timeout 200 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 120 --timeout-method thread tests/runtime/test_gpu_runtime.py -k prefill_graphs 2>&1 | tee "$OUT/gpu_prefill_graph_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -20 ;;
    bf16-tests) timeout 240 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 120 --timeout-method thread tests/runtime/test_gpu_runtime.py tests/runtime/test_gpu_sampling.py -k "not triton and not mixed and not prefill_graphs" 2>&1 | tee "$OUT/gpu_bf16_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -24 ;;
    quick-tests) python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/runtime 2>&1 | tee "$OUT/gpu_tests.log" | tail -15 ;;
    decode) python3 bench/decode.py --out "$OUT" 2>&1 | tail -30 ;;
    decode-quick) python3 bench/decode.py --quick --out "$OUT" 2>&1 | tail -30 ;;
    ab-rope)  # round 20: the batch-1 q|k|v GEMV with RoPE in its epilogue against the two launches, alternating, in one process
      timeout 420 python3 bench/ab_step.py --out "$OUT" --name ab_rope --batch 1 --rounds ${AB_ROUNDS:-3} --variants "PDL, RoPE apart" "PDL, GEMV autotuned" 2>&1 | tail -8 ;;
    ab-gemv)  # round 20: every batch-1 GEMV at one config (the engine's, 2x2048, and 4x1024) against the autotuner's picks, alternating, in one process
      timeout 420 python3 bench/ab_step.py --out "$OUT" --name ab_gemv --batch 1 --rounds ${AB_ROUNDS:-2} --variants "PDL, GEMV autotuned" "PDL" "PDL, GEMV 4x1024" 2>&1 | tail -10 ;;
    ab-early-kv)  # round 21: decode attention reading earlier steps' keys and values before its wait, against waiting first, alternating, in one process
      timeout 500 python3 bench/ab_step.py --out "$OUT" --name ab_early_kv --batch ${AB_BATCH:-1 8 64} --rounds ${AB_ROUNDS:-3} --variants "PDL, attention waits first" "PDL" 2>&1 | tail -20 ;;
    ab-early-rope)  # round 21: the RoPE kernels reading position, slot and cos/sin before their wait, against after, alternating, in one process
      timeout 500 python3 bench/ab_step.py --out "$OUT" --name ab_early_rope --batch ${AB_BATCH:-1 8 64} --rounds ${AB_ROUNDS:-3} --variants "PDL, RoPE tables after the wait" "PDL" 2>&1 | tail -20 ;;
    ab-mma)  # round 22: 2-16 rows' linears on the tensor-core GEMV against round 21's small-M Triton kernel and cuBLAS, alternating, in one process
      timeout 500 python3 bench/ab_step.py --out "$OUT" --name ab_mma --batch ${AB_BATCH:-4 8 16} --rounds ${AB_ROUNDS:-3} --variants "PDL, small-M on Triton and cuBLAS" "PDL" 2>&1 | tail -20 ;;
    ab-mma-rope)  # round 23: 2-16 rows' q|k|v RoPE and cache write in the tensor-core GEMV's epilogue against the engine as it is, alternating
      timeout 500 python3 bench/ab_step.py --out "$OUT" --name ab_mma_rope --batch ${AB_BATCH:-2 8 16} --rounds ${AB_ROUNDS:-3} --variants "PDL" "PDL, q|k|v RoPE in the tensor-core GEMV" 2>&1 | tail -20 ;;
    ab-gated)  # round 25: 2-16 rows' gate_up_proj on the tensor-core GEMV's gated build (two rings) against cuBLAS and the SiLU-mul, alternating
      timeout 500 python3 bench/ab_step.py --out "$OUT" --name ab_gated --batch ${AB_BATCH:-2 8 16} --rounds ${AB_ROUNDS:-2} \
        --variants "PDL, gate_up on cuBLAS" "PDL, gate_up gated on the tensor-core GEMV, ring 1x4" "PDL" 2>&1 | tail -20 ;;
    ab-step) timeout 420 python3 bench/ab_step.py --out "$OUT" --variants "one-launch prologue, no PDL" "PDL, not attention" "PDL" 2>&1 | tail -14 ;;
    guided-pdl-tests)  # PDL is opt-in: does the guided graphs' capture failure of round 9 repeat with it on?
      for i in ${PDL_REPEATS:-1 2}; do FASTPATH_PDL=1 timeout 200 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 150 --timeout-method thread tests/runtime/test_gpu_guided.py 2>&1 | tee "$OUT/gpu_guided_pdl_tests-$i.log" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -8; done ;;
    mlp-block-tests) timeout 300 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 150 --timeout-method thread tests/runtime/test_gpu_mlp_block.py 2>&1 | tee "$OUT/gpu_mlp_block_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -30 ;;
    ab-mlp-block)  # round 30: 1-16 rows' half after attention in one persistent launch (mlp_block.cu) against the engine, alternating
      timeout 500 python3 bench/ab_step.py --out "$OUT" --name ab_mlp_block --batch ${AB_BATCH:-1 2 8 16} --rounds ${AB_ROUNDS:-2} \
        --variants "PDL" "PDL, MLP half in one persistent launch" ${AB_EXTRA:+"$AB_EXTRA"} 2>&1 | tail -20 ;;
    ab-lines)  # round 31: the engine's 2-16-row linears (whole-line rings, gate_up gated) against round 30's, each change alone taken back, and two slots, alternating
      timeout 560 python3 bench/ab_step.py --out "$OUT" --name ab_lines --batch ${AB_BATCH:-2 4 8 16} --rounds ${AB_ROUNDS:-2} \
        --variants "PDL" "PDL, round 30's linears" "PDL, gate_up on cuBLAS" "PDL, per-lane rings" "PDL, plain ring 2x2" ${AB_EXTRA:+"$AB_EXTRA"} 2>&1 | tail -34 ;;
    mlp-block) timeout 300 python3 bench/mlp_block.py --out "$OUT" 2>&1 | tail -16 ;;
    mma-tests) timeout 200 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 120 --timeout-method thread tests/runtime/test_gpu_mma_gemv.py 2>&1 | tee "$OUT/gpu_mma_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -30 ;;
    kernel-tests) timeout 300 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 150 --timeout-method thread tests/runtime/test_gpu_runtime.py ${KERNEL_TESTS:+-k "$KERNEL_TESTS"} 2>&1 | tee "$OUT/gpu_kernel_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -30 ;;
    decode-sampling) timeout 300 python3 bench/decode.py --quick --no-hf --no-compile-peer --variants fused --batch 8 64 256 --long-context 0 --name decode-sampling --out "$OUT" 2>&1 | tail -12 ;;
    # #18's table: batch 1 to 256 and 8k-token contexts beside the torch.compile peer, sampled rows too.
    linear) timeout 300 python3 bench/linear.py --out "$OUT" ${LINEAR_ARGS:-} 2>&1 | tail -10 ;;
    decode-greedy)  # #18: greedy rows only, batch 1 to 64, no peer (the small-M kernel's batches)
      timeout 300 python3 bench/decode.py --quick --no-hf --no-compile-peer --variants fused --sampling greedy --batch ${GREEDY_BATCHES:-1 8 16 32 64} \
        --long-context 0 --name decode-greedy --out "$OUT" 2>&1 | tail -12 ;;
    decode-18) timeout 520 python3 bench/decode.py --quick --no-hf --variants fused --batch 1 8 64 256 --long-context ${LONG_CONTEXT:-8192} \
      --stack-dump-s 240 --name decode-18 --out "$OUT" 2>&1 | tail -24 ;;
    decode-generated)  # #18: the compiled llama_1b package against native, 5 alternating runs a batch
      python3 -m pip install -q --no-build-isolation --no-deps ./generated/llama-1b >>"$log" 2>&1 || echo "llama_1b build failed" | tee -a "$log"
      timeout 400 python3 bench/decode.py --quick --no-hf --no-compile-peer --variants fused --sampling greedy --batch 1 8 64 --long-context 0 \
        --package llama_1b --alternate 5 --name decode-generated --out "$OUT" 2>&1 | tail -12 ;;
    guided-threads)  # the C++ fill over 1, 4 and 8 threads in one engine, batch 16, spin (round 18's call 1 also swept 2 and ran the guided GPU tests)
      timeout 300 python3 bench/guided.py --quick --modes spin --batch 16 --fill-threads ${FILL_THREADS:-1 4 8} --name guided-threads --out "$OUT" 2>&1 | tail -6 ;;
    guided-3)  # #18's guided rows, three consecutive runs, batch 16, spin
      for i in 1 2 3; do
        timeout 200 python3 bench/guided.py --quick --modes spin --batch 16 --name "guided-run-$i" --out "$OUT" 2>&1 | tail -4
      done ;;
    decode-fused) python3 bench/decode.py --quick --no-hf --variants fused --out "$OUT" 2>&1 | tail -30 ;;
    tp-decode)
      for m in random:llama-1b random:llama-8b; do
        timeout 300 python3 bench/decode.py --quick --no-hf --no-compile-peer --variants fused --sampling greedy --batch 1 8 64 --long-context 0 \
          --tp 2 --model "$m" --name "decode-tp2-${m#random:}" --out "$OUT" 2>&1 | tail -12
      done ;;
    tp-decode-1b|tp-decode-8b)  # one model per device call: both in one call ran past its 600 s
      m="random:llama-${step#tp-decode-}"
      timeout 560 python3 bench/decode.py --quick --no-hf --no-compile-peer --variants fused --sampling greedy --batch 1 8 64 --long-context 0 \
        --tp 2 --model "$m" --name "decode-tp2-${m#random:}" --stack-dump-s 200 --out "$OUT" 2>&1 | tail -40 ;;
    allreduce) timeout 200 python3 bench/allreduce.py --out "$OUT" 2>&1 | tail -20 ;;
    prefill) timeout 200 python3 bench/prefill.py --out "$OUT" 2>&1 | tail -8 ;;
    prefix-cache) timeout 300 python3 bench/prefix_cache.py --out "$OUT" 2>&1 | tail -8 ;;
    lora) timeout 420 python3 bench/lora.py --out "$OUT" 2>&1 | tail -8 ;;
    tp-two-shot) timeout 200 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --timeout 120 --timeout-method thread tests/runtime/test_gpu_tensor_parallel.py -k two_shot 2>&1 | tee "$OUT/gpu_tp_two_shot.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | tail -20 ;;
    sampler) timeout 420 python3 bench/sampler.py --out "$OUT" --variants ${SAMPLER_VARIANTS:-4096x512x4 2048x512x4} ${SAMPLER_ARGS:-} 2>&1 | tail -30 ;;
    profile)  # kernel times inside the greedy graphs at batch 1, 8 and 64, with programmatic dependent launch, then without (each kernel's own time)
      timeout 200 python3 bench/profile_step.py --batch ${PROFILE_BATCH:-1 8 64} --out "$OUT" 2>&1 | tail -45
      mkdir -p "$OUT/nopdl" && FASTPATH_PDL=0 timeout 200 python3 bench/profile_step.py --batch ${PROFILE_BATCH:-1 8 64} --out "$OUT/nopdl" 2>&1 | tail -45 ;;
    profile-general) timeout 200 python3 bench/profile_step.py --kind general --batch 8 64 --out "$OUT" 2>&1 | tail -30 ;;
    host-phases) timeout 240 python3 bench/host_phases.py --out "$OUT" --batch 64 256 2>&1 | tail -8 ;;
    step-timeline-pdl)  # #18: batch 256's loop against its replay with programmatic dependent launch off, then on
      FASTPATH_PDL=0 timeout 150 python3 bench/step_timeline.py --out "$OUT" --batch 256 --sampling greedy --name step_timeline_nopdl 2>&1 | tail -12
      timeout 150 python3 bench/step_timeline.py --out "$OUT" --batch 256 --sampling greedy --name step_timeline_pdl 2>&1 | tail -12 ;;
    step-timeline) timeout 240 python3 bench/step_timeline.py --out "$OUT" ${TIMELINE_ARGS:-} 2>&1 | tail -8 ;;
    host-profile) timeout 150 python3 bench/host_profile.py --out "$OUT" 2>&1 | grep -v "^$" | head -60 ;;
    serve-64) timeout 300 python3 bench/serve.py --out "$OUT" --requests 256 --concurrency 64 2>&1 | tail -9 ;;
    serve-1024|serve-final)  # #17: 1024 requests (the clients' ramp and tail weigh a quarter of 256's), one and four API processes
      timeout 420 python3 bench/serve.py --out "$OUT" --requests 1024 --concurrency 64 --api-server-count 1 4 --name "$step" 2>&1 | tail -8 ;;
    serve-ab)  # #17: round 10's server (CPython's 5 ms GIL switch, admission after read-back) beside each change
      timeout 500 python3 bench/serve.py --out "$OUT" --requests 1024 --concurrency 64 --api-server-count 4 --name serve-ab \
        --server-env "FASTPATH_GIL_SWITCH_US=0,FASTPATH_ADMIT_BESIDE=0" "FASTPATH_ADMIT_BESIDE=0" "" 2>&1 | tail -8 ;;
    serve-gil)  # #17: the GIL switch interval of the engine and API processes, the default (0.1 ms since round 13) beside GIL_VARIANTS µs
      variants=(); for us in ${GIL_VARIANTS:-500}; do variants+=("FASTPATH_GIL_SWITCH_US=$us"); done
      timeout 540 python3 bench/serve.py --out "$OUT" --requests 1024 --concurrency 64 --api-server-count 4 --name serve-gil \
        --server-env "" "${variants[@]}" 2>&1 | tail -8 ;;
    serve-env)  # #17: the server as it is beside variants, each an environment (SERVE_VARIANTS="FASTPATH_GC_FREEZE=0 ...")
      timeout 540 python3 bench/serve.py --out "$OUT" --requests 1024 --concurrency 64 --api-server-count 4 --name serve-env --access-log \
        --server-env "" ${SERVE_VARIANTS:-FASTPATH_GC_FREEZE=0} 2>&1 | tail -8 ;;
    serve-phases)  # #17: the server beside itself with its engine loop's phases timed (bench/phase_probe), into $OUT/phases-PID.json
      timeout 540 python3 bench/serve.py --out "$OUT" --requests 1024 --concurrency 64 --api-server-count 4 --name serve-phases --access-log \
        --server-env "" "PYTHONPATH=$PWD/bench/phase_probe:$PYTHONPATH,FASTPATH_PHASES_OUT=$OUT" 2>&1 | tail -8 ;;
    serve-check)  # #17: the server as it is (four API processes) beside offline generate, 1024 requests at concurrency 64
      timeout 400 python3 bench/serve.py --out "$OUT" --requests 1024 --concurrency 64 --api-server-count 4 --name serve-check --access-log 2>&1 | tail -8 ;;
    serve-api-servers) timeout 540 python3 bench/serve.py --out "$OUT" --requests 256 --concurrency 64 --api-server-count 1 2 4 2>&1 | tail -10 ;;
    serve-interval) timeout 420 python3 bench/serve.py --out "$OUT" --requests 256 --concurrency 64 --stream-interval 1 4 2>&1 | tail -10 ;;
    host) python3 bench/host_step.py --out "$OUT" 2>&1 | tail -8 ;;
    serve) python3 bench/serve.py --out "$OUT" --requests 128 2>&1 | tail -30 ;;
    serve-512) python3 bench/serve.py --out "$OUT" --requests 512 --concurrency 64 2>&1 | tail -8 ;;
    guided) python3 bench/guided.py --out "$OUT" 2>&1 | tail -30 ;;
    hostdispatch) python3 bench/hostdispatch.py --quick --out "$OUT" 2>&1 | tail -30 ;;
    *) echo "unknown step $step" ;;
  esac
  stamp "$step"
  # After every step, so a run cut short by the device's time limit still returns what it finished.
  tar -C "$OUT" --exclude=bench-tokenizer-32k -czf "$FINAL/results.tgz" .
  cp "$log" "$FINAL/device.log"
done
