# from the repository root on the GPU machine (exp.py copied there); each bench is one process
export TUNECL_DEVICE=nvidia
W=$PWD/work4; mkdir -p $W
export TUNECL_DB=$W/user.sqlite TUNECL_STORAGE=$W/studies.sqlite
r() { n=$1; shift; EXP=$n timeout 45 python exp.py "$@" > $W/$n-$(echo "$@" | tr -dc 'a-z0-9').txt 2>&1; }
r plain bench --net resnet50 --batch 16 --compare cuda
for e in profiling flush1 flush16 plain; do r $e bench --net resnet50 --batch 16 --compare none; done
for e in plain profiling flush16; do r $e bench --net resnet50 --batch 16 --train --compare none; done
