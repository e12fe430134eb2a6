"""Focused tuning of one fp32 GEMM family at 4096^3 (call 4 of this folder): tune_sgemm.py DB FAMILY TRIALS SECONDS OUT [SEED_CONFIG_JSON]."""
import json, sys, time


def main():
    from tunecl import runtime
    from tunecl import kernels
    from tunecl.db import TuningDB
    from tunecl.problems import GemmProblem
    from tunecl.tune import tune_problem
    db_url, family, trials, limit, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    seeds = [(family, json.loads(sys.argv[6]))] if len(sys.argv) > 6 else []
    dev = runtime.select_device("nvidia")
    p = GemmProblem(4096, 4096, 4096)
    t = time.time()
    with TuningDB(db_url) as db:
        o = tune_problem(p, dev, db, trials=trials, time_limit=limit, algorithms=[kernels.algorithm(family)],
                         jobs=8, patience=None, seeds=seeds)
    d = o.to_dict()
    w = d["winner"]
    print(f"{family}: {d['trials']} trials in {time.time()-t:.0f} s; best {w['time_s']*1e3:.4f} ms "
          f"{w['gflops']:.0f} GFLOP/s {json.dumps(w['config'])}; default "
          f"{(d['default'] or {}).get('gflops') or 0:.0f} GFLOP/s", flush=True)
    json.dump(d, open(out, "w"), indent=1, default=str)
    with open(out + ".config", "w") as f:
        f.write(family + ":" + ",".join(f"{k}={v}" for k, v in w["config"].items()))


if __name__ == "__main__":
    main()
