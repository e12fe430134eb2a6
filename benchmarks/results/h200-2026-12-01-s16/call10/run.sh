# Session 16, call 10: with the float4 fixup, the device tests of stream-K, then the tuner choosing between
# the 4096^3 winner with STREAMK 0 / 1 / 2 (4096^3 and two shapes whose last wave is nearly empty), the
# benchmark on them (tunecl tuned vs cuBLAS, TF32 off; 4096^3 twice) and the DB's export. Run from the
# repository root with TUNECL_DEVICE set to the GPU and OUT to an empty folder.
set -u
W=MWG=128,NWG=128,KWG=8,SPLITK=1,MDIMC=16,NDIMC=16,VWM=1,VWN=4,STRM=0,STRN=1,KWI=8,SA=1,SB=1,ASYNC=4,MDIMA=32,NDIMB=32,VWA=4,VWB=4,DB=0,PAD=0,GM=8,RWGS=0,MAXRREG=168
python -m pytest -q -n 8 tests/device/test_gemm_streamk.py tests/device/test_gemm_async.py > "$OUT/pytest.txt" 2>&1
tail -1 "$OUT/pytest.txt"
for shape in 4096,4096,4096 4224,4224,4096 4096,4352,4096; do
  python -m tunecl tune --gemm "$shape" --device nvidia --algorithms gemm_tiled --trials 4 --try "gemm_tiled:$W,STREAMK=0" \
    --try "gemm_tiled:$W,STREAMK=1" --try "gemm_tiled:$W,STREAMK=2" --db "$OUT/db.sqlite" \
    --storage "$OUT/optuna.sqlite" --no-progress > "$OUT/tune-${shape//,/x}.txt" 2>&1
  tail -12 "$OUT/tune-${shape//,/x}.txt" | head -6
done
python benchmarks/gemm.py --device nvidia --shapes 4096,4096,4096 4224,4224,4096 4096,4352,4096 --rounds 5 \
  --db "$OUT/db.sqlite" --storage "$OUT/optuna.sqlite" > "$OUT/bench.txt" 2>&1
tail -6 "$OUT/bench.txt"
python benchmarks/gemm.py --device nvidia --shapes 4096,4096,4096 --rounds 5 --db "$OUT/db.sqlite" \
  --storage "$OUT/optuna.sqlite" > "$OUT/bench-4096-again.txt" 2>&1
tail -3 "$OUT/bench-4096-again.txt"
python -m tunecl db export --device nvidia --db "$OUT/db.sqlite" -o "$OUT/export.json"
