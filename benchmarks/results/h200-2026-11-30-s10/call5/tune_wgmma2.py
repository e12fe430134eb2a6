"""Tune the wgmma GEMM-backed conv variants on resnet50's b64 problems they apply to that the earlier
run did not reach (longest first, until a deadline); call 5 of this folder: tune_wgmma2.py DB SECONDS OUT."""
import json, sys, time


def main():
    from tunecl import runtime
    from tunecl.db import TuningDB
    from tunecl.kernels import conv_gemm_wgmma
    from tunecl.problems import ConvProblem
    from tunecl.tune import tune_problem
    db_url, seconds, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    deadline = time.time() + seconds
    dev = runtime.select_device("nvidia")
    recs = json.load(open("tuning_db/nvidia-h200.json"))["records"]
    best, tried = {}, set()
    for r in recs:
        p = r["problem"]
        if "wgmma_tf32" in r["algorithm"] and p.startswith("conv"):
            tried.add(p)
        if not p.startswith("conv:n=64,") or r["status"] != "ok" or "float16" in p:
            continue
        if p not in best or r["time_s"] < best[p]["time_s"]:
            best[p] = r
    rows = []
    with TuningDB(db_url) as db:
        for key, r in sorted(best.items(), key=lambda kv: -kv[1]["time_s"]):
            if key in tried:
                continue
            p = ConvProblem.parse(key[5:])
            algs = [a for a in conv_gemm_wgmma.ALGORITHMS if a.applies(p, dev)]
            if not algs:
                continue
            if time.time() > deadline:
                print("deadline, not tuned:", key[5:], flush=True)
                continue
            t = time.time()
            d = tune_problem(p, dev, db, trials=8, time_limit=5, algorithms=algs, jobs=8, precision="tf32",
                             patience=None).to_dict()
            w = d.get("winner") or {}
            new_t = w.get("time_s")
            print(f"{key[5:]}  shipped best {r['algorithm']} {r['time_s']*1e3:.3f} ms  wgmma best {w.get('algorithm')} "
                  f"{(new_t or float('nan'))*1e3:.3f} ms  ({time.time()-t:.0f} s)", flush=True)
            rows.append({"problem": key, "shipped": r["algorithm"], "shipped_ms": r["time_s"] * 1e3,
                         "wgmma": w.get("algorithm"), "wgmma_ms": None if new_t is None else new_t * 1e3})
    json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
