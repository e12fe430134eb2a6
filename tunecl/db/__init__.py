"""The tuning database: results of tuning runs, looked up per device and problem.

``TuningDB`` is the facade (``record``, ``best``, ``lookup``, ``lookup_near_batch``, ``results``,
``stats``, ``prune``, ``export``, ``import_``); ``open_db`` shares one per process; the exchange functions
read and write the JSON export document that ``tunecl db export/import`` and the shipped ``tuning_db/``
folder use.
"""

from tunecl.db.exchange import export_document, import_document, read_document, write_document
from tunecl.db.records import Hit, ImportReport, Record
from tunecl.db.store import TuningDB, open_db

__all__ = ["Hit", "ImportReport", "Record", "TuningDB", "export_document", "import_document", "open_db",
           "read_document", "write_document"]
