# Session 16, call 6: the GEMM device tests with stream-K on the H200 (the tuning that followed is
# call 7's run.sh: here `tunecl` was not on PATH, and benchmarks/gemm.py tuned the shapes itself). Run from the repository root with TUNECL_DEVICE
# set to the GPU and OUT to an empty folder.
set -u
W=MWG=128,NWG=128,KWG=8,SPLITK=1,MDIMC=16,NDIMC=16,VWM=1,VWN=4,STRM=0,STRN=1,KWI=8,SA=1,SB=1,ASYNC=4,MDIMA=32,NDIMB=32,VWA=4,VWB=4,DB=0,PAD=0,GM=8,RWGS=0,MAXRREG=168
python -m pytest -q -n 8 tests/device/test_gemm_streamk.py tests/device/test_gemm.py tests/device/test_gemm_async.py \
  tests/device/test_gemm_splitk.py tests/device/test_transpose.py > "$OUT/pytest.txt" 2>&1
tail -3 "$OUT/pytest.txt"
