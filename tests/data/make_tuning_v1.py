"""Build ``tuning_v1.sqlite``: a tuning DB at schema revision 0001 with three results.

It is checked in and must never be regenerated once a later revision exists: the migration tests
prove that DBs written by that release still open. Rows are written with plain SQL so the file does
not depend on today's models. Run: ``python tests/data/make_tuning_v1.py``.
"""

import json
from pathlib import Path

from alembic import command
from sqlalchemy import create_engine, text

from tunecl.db.schema import alembic_config

FINGERPRINT = {
    "vendor": "Portable Computing Language", "name": "cpu-haswell-Intel(R) Xeon(R)", "driver_version": "5.0",
    "opencl_c_version": "OpenCL C 1.2 PoCL", "device_type": "cpu", "compute_units": 2,
    "max_work_group_size": 4096, "local_mem_size": 524288, "global_mem_size": 8589934592,
    "platform": "Portable Computing Language", "device_version": "OpenCL 3.0 PoCL",
}
GEMM = "gemm:m=256,n=256,k=256,ta=0,tb=0,batch=1,dtype=float32"
CONV = "conv:n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1x1,pad=1x1,dil=1x1,groups=1,dir=fwd,dtype=float32"


def main(path: Path) -> None:
    from tunecl.fingerprint import Fingerprint

    path.unlink(missing_ok=True)
    fingerprint = Fingerprint.from_dict(FINGERPRINT)
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0001")
        connection.execute(text("INSERT INTO tunecl_devices (id, key, model_key, fingerprint, label) "
                                "VALUES (1, :key, :model_key, :fingerprint, :label)"),
                           {"key": fingerprint.key, "model_key": fingerprint.model_key,
                            "fingerprint": json.dumps(FINGERPRINT), "label": fingerprint.label})
        connection.execute(text("INSERT INTO tunecl_problems (id, key, kind) VALUES (1, :g, 'gemm'), "
                                "(2, :c, 'conv')"), {"g": GEMM, "c": CONV})
        insert = text(
            "INSERT INTO tunecl_results (device_id, problem_id, algorithm, algorithm_version, params, "
            "precision, status, time_s, default_time_s, trials, tunecl_version, created_at, origin) VALUES "
            "(1, :problem, :algorithm, 1, :params, 'fp32', :status, :time, :default, :trials, '0.1.0', "
            ":created, 'tuned on ci')")
        connection.execute(insert, [
            {"problem": 1, "algorithm": "gemm_tiled", "params": json.dumps({"MWG": 64, "NWG": 64, "KWG": 16}),
             "status": "ok", "time": 0.00125, "default": 0.0025, "trials": 40,
             "created": "2025-01-02 03:04:05.000000"},
            {"problem": 2, "algorithm": "conv_im2col", "params": json.dumps({"MWG": 32}), "status": "ok",
             "time": 0.0105, "default": None, "trials": 12, "created": "2025-01-02 03:05:00.000000"},
            {"problem": 2, "algorithm": "conv_winograd", "params": json.dumps({"TILE": 4}),
             "status": "failed:wrong result", "time": None, "default": None, "trials": 3,
             "created": "2025-01-02 03:06:00.000000"},
        ])
    with engine.connect() as connection:
        connection.exec_driver_sql("VACUUM")  # one self-contained file, no WAL
    engine.dispose()


if __name__ == "__main__":
    main(Path(__file__).resolve().parent / "tuning_v1.sqlite")
