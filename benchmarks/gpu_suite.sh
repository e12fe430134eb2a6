#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md, run one after another under one time budget.
#
#   bash benchmarks/gpu_suite.sh OUTDIR BUDGET_SECONDS [STEP ...]
#
# Steps: mma bench validate conv tests (the default, in this order); when named: gemm_mma or conv_mma
# (one half of mma), fp16 (~4 min), pretrans (~3 min), space (~3 min), graph (~5 min: benches with and without
# --graph, GRAPH_BENCH net:batch:precision:infer|train list), host (~3 min: launch_cost.py,
# overhead.py with its rows in OUTDIR/host.csv, batch_norm.py and host_profile.py), ship (tunes resnet18/50 batch 16 with --train for tunecl/tuning_db/;
# SHIP_TIME_LIMIT seconds per problem, default 8), launches (~8 min: launch_savings.py with the CUDA peer over
# LAUNCH_NETS, LAUNCH_ROUNDS rounds) and convergence (~16 min). Each step gets what is left of the budget (a step that cannot start with at least MIN_STEP_S seconds left is skipped and
# logged); every command writes its own file under OUTDIR, and OUTDIR.tar.gz is rewritten after
# every command, so a run cut off from outside still leaves everything finished so far in one file.
# Steps run sequentially: concurrent GPU work (or CPU-heavy work next to a timing) skews timings.
#
# Environment: NETS replaces the validate step's net list, BENCH the bench step's net:batch list, TESTS the test step's paths. PACK names the archive (default OUTDIR.tar.gz; e.g. a folder that is copied back while
# OUTDIR's many small files stay behind). TUNECL_DEVICE selects the GPU (default: nvidia). The user DB is a fresh file under
# OUTDIR unless TUNECL_DB is set; the shipped results in tunecl/tuning_db/ are used as in a user's install.
set -u
out=${1:?usage: gpu_suite.sh OUTDIR BUDGET_SECONDS [STEP ...]}
budget=${2:?usage: gpu_suite.sh OUTDIR BUDGET_SECONDS [STEP ...]}
shift 2
steps=${*:-mma bench validate conv tests}
MIN_STEP_S=${MIN_STEP_S:-25}
PY=${PYTHON:-python}
mkdir -p "$out"
export TUNECL_DEVICE=${TUNECL_DEVICE:-nvidia}
export TUNECL_DB=${TUNECL_DB:-$out/tuning.sqlite}
export TUNECL_STORAGE=${TUNECL_STORAGE:-$out/studies.sqlite}
deadline=$(( $(date +%s) + budget ))
left() { echo $(( deadline - $(date +%s) )); }
pack() { tar czf "${PACK:-$out.tar.gz}" -C "$(dirname "$out")" "$(basename "$out")" 2>/dev/null; }
log() { echo "$*" | tee -a "$out/log.txt"; }

# run NAME TIMEOUT_CAP COMMAND...: one command, stdout+stderr to OUTDIR/NAME.txt, logged and packed
run() {
  local name=$1 cap=$2; shift 2
  local t; t=$(left)
  if [ "$t" -lt "$MIN_STEP_S" ]; then log "skip $name (${t}s left)"; return; fi
  [ "$cap" -gt 0 ] && [ "$cap" -lt "$t" ] && t=$cap
  local start; start=$(date +%s)
  timeout -s INT -k 10 "$t" "$@" > "$out/$name.txt" 2>&1
  log "$name rc=$? $(( $(date +%s) - start ))s"
  pack
}

run devices 30 "$PY" -m tunecl devices
for step in $steps; do
  case $step in
    mma|gemm_mma|conv_mma)
               # tensor cores: GEMM (probes, correctness, timings next to torch.mm with TF32 on and off),
               # then the implicit-GEMM conv (correctness, timings next to cuDNN with TF32 on and off; then
               # its float16 variant next to cuDNN in float16), then the wgmma GEMM (probe, correctness, timings)
      [ "$step" = conv_mma ] || run gemm_mma 240 "$PY" benchmarks/gemm_mma.py --device "$TUNECL_DEVICE" \
        --budget 180 --json "$out/gemm_mma.json"
      [ "$step" = gemm_mma ] || run conv_mma 180 "$PY" benchmarks/conv_mma.py --device "$TUNECL_DEVICE" \
        --budget 150 --json "$out/conv_mma.json"
      [ "$step" = gemm_mma ] || run conv_mma_f16 180 "$PY" benchmarks/conv_mma.py --device "$TUNECL_DEVICE" \
        --fp16 --budget 150 --json "$out/conv_mma_f16.json"
      [ "$step" = conv_mma ] || run gemm_wgmma 200 "$PY" benchmarks/gemm_wgmma.py --device "$TUNECL_DEVICE" \
        --json "$out/gemm_wgmma.json" ;;
    fp16)      # issue 8: float16 GEMMs tuned over the f16 families, next to torch.mm on float16 tensors
      run gemm-fp16 300 "$PY" benchmarks/gemm.py --device "$TUNECL_DEVICE" --precision fp16 \
        --shapes 4096,4096,4096 1024,1024,1024 --trials 40 --time-limit 100 --retune --json "$out/gemm-fp16.json" ;;
    pretrans)  # issue 8: TF32 wgmma with the MN-contiguous operand transposed first (PRETRANS) or not, nn and nt
      run gemm_wgmma-pretrans 240 "$PY" benchmarks/gemm_wgmma.py --device "$TUNECL_DEVICE" --dtypes float32 \
        --shapes 4096,4096,4096 --layouts nn nt --check-configs 0 --configs 12 --json "$out/gemm_wgmma-pretrans.json" ;;
    space)     # issue 3: exhaustive search of a reduced fp32 GEMM space at 4096^3, to judge the tuner
      run gemm_space-4096 200 "$PY" benchmarks/gemm_space.py --device "$TUNECL_DEVICE" \
        --shape 4096,4096,4096 --time-limit 170 --json "$out/gemm_space-4096.json" ;;
    bench)     # the seed's table: ms per batch next to torch CUDA fp32, TF32 off
      # (a throw-away first bench: the first processes on a freshly started machine ran 20-50% slower)
      run bench-warmup 120 "$PY" -m tunecl bench --net resnet18 --batch 16 --compare none
      for spec in ${BENCH:-resnet50:16 resnet18:16 mobilenet_v2:16 alexnet:16 vgg16:16 \
                  resnet50:64 resnet18:64 mobilenet_v2:64 alexnet:64 vgg16:64}; do
        net=${spec%%:*}; batch=${spec##*:}
        run "bench-$net-b$batch" 120 "$PY" -m tunecl bench --net "$net" --batch "$batch" --compare cuda --json
        run "bench-$net-b$batch-train" 150 "$PY" -m tunecl bench --net "$net" --batch "$batch" --train \
          --compare cuda --json
      done ;;
    graph)     # the host-bound steps replayed from a captured graph (tunecl bench --graph; the CUDA peer
               # replays torch.cuda.graph), each next to the same bench run eagerly; then the host time of a
               # step eager against replayed
      run bench-warmup 120 "$PY" -m tunecl bench --net resnet18 --batch 16 --compare none
      for spec in ${GRAPH_BENCH:-resnet50:16:fp32:infer resnet50:16:fp32:train resnet50:64:tf32:train}; do
        IFS=: read -r net batch precision mode <<< "$spec"
        train=""; [ "$mode" = train ] && train="--train"
        for how in graph eager; do
          flag=""; [ "$how" = graph ] && flag="--graph --profile 3"   # (device busy of the replays)
          run "bench-$net-b$batch-$precision-$mode-$how" 150 "$PY" -m tunecl bench --net "$net" --batch "$batch" \
            --precision "$precision" $train $flag --compare cuda --json
        done
      done
      run graph_replay 120 "$PY" benchmarks/graph_replay.py --net resnet50 --batch 16 --train ;;
    validate)  # issue 7 on the GPU: all 18 nets, a training step, nothing on the CPU fallback
      for net in ${NETS:-squeezenet1_0 mobilenet_v3_small shufflenet_v2_x1_0 resnet18 alexnet mnasnet1_0 \
                 mobilenet_v2 mobilenet_v3_large efficientnet_b0 regnet_y_400mf googlenet vgg16 \
                 resnet50 resnext50_32x4d inception_v3 wide_resnet50_2 densenet161 efficientnet_b4}; do
        TUNECL_FALLBACK=error run "validate-$net" 300 "$PY" -m tunecl validate --net "$net" --train \
          --batch 4 --image-size 224 --json
      done ;;
    conv)      # every conv layer of resnet50 in all three directions next to cuDNN (TF32 off)
      run conv-resnet50-b16-train 0 "$PY" benchmarks/conv.py --device "$TUNECL_DEVICE" --net resnet50 \
        --batch 16 --train --trials 6 --time-limit 6 --json "$out/conv-resnet50-b16-train.json" ;;
    convergence)  # issue 3: trials until the tuner is within 5% of its best at 4096^3, per sampler
      for sampler in tpe random; do
        run "convergence-$sampler" 480 "$PY" benchmarks/tuner_convergence.py --device "$TUNECL_DEVICE" \
          --shape 4096,4096,4096 --trials 300 --sampler "$sampler" --jobs 8 --time-limit 450 \
          --json "$out/convergence-$sampler.json"
      done ;;
    ship)      # issue 6: the shipped H200 results - resnet18 and resnet50 at batch 16, forward and train,
               # tuned into the suite's DB (problems tunecl/tuning_db/ holds for this driver are skipped) and exported for tunecl/tuning_db/
      # (SHIP_NETS replaces the net:batch list; the DB is exported after every net, and every finished
      # problem is in the DB, so a run cut off by the budget still leaves its results in OUTDIR.tar.gz)
      for spec in ${SHIP_NETS:-resnet18:16 resnet50:16}; do
        net=${spec%%:*}; batch=${spec##*:}
        cap=$(( $(left) - 30 ))  # 30 s kept for the export
        [ "$cap" -lt 1 ] && cap=1
        MIN_STEP_S=60 run "ship-$net-b$batch-train" "$cap" "$PY" -m tunecl tune --net "$net" --batch "$batch" --train \
          --device "$TUNECL_DEVICE" --time-limit "${SHIP_TIME_LIMIT:-8}" --jobs 8 --json --no-progress
        MIN_STEP_S=1 run ship-export 60 "$PY" -m tunecl db export --device "$TUNECL_DEVICE" -o "$out/ship-export.json"
      done ;;
    host)      # where the host time goes: the parts of a launch, an allocation, then resnet50's ops
      run launch_cost 60 "$PY" benchmarks/launch_cost.py --device "$TUNECL_DEVICE"
      run overhead 60 "$PY" benchmarks/overhead.py --record "$out/host.csv"
      run batch_norm 120 "$PY" benchmarks/batch_norm.py --device "$TUNECL_DEVICE" --batch 64 \
        --json "$out/batch_norm.json"
      run host-resnet50-b16-train 120 "$PY" benchmarks/host_profile.py --net resnet50 --batch 16 --train \
        --torch-profiler --iterations 3 --top 30 ;;
    launches)  # the eager launch savings on and off, alternating rounds, each run with its torch CUDA peer
      run launch-savings 900 "$PY" benchmarks/launch_savings.py --nets "${LAUNCH_NETS:-resnet18,mobilenet_v2}" \
        --compare cuda --rounds "${LAUNCH_ROUNDS:-3}" ;;
    tests)     # GPU-only correctness: the device and torch test subsets on the GPU
      run pytest-device 0 "$PY" -m pytest -q -rfE --tb=short ${TESTS:-tests/device tests/torch} ;;
    *) log "unknown step $step (steps: mma gemm_mma conv_mma fp16 pretrans bench graph validate conv space ship convergence host launches tests)" ;;
  esac
done
log "done, $(left)s of the budget left"
pack
