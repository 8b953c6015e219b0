"""The batch DAGs' contract with whoever triggers or watches them: DAG ids, task ids, params, the recompute's flags.

``dags/trends_batch.py`` defines the DAGs with these names; ``trends batch backfill``, ``trends demo``, the console
and the batch exporter trigger and read them by the same names over Airflow's REST API. A string changed here
changes every side at once (a run already triggered keeps the names it was triggered with).
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Final

# -- the hourly recompute of live data ---------------------------------------------------------------------------
BATCH_DAG: Final = "trends_batch"
WAIT_TASK: Final = "wait_until_closed"  # indexes, then pokes until the hour is closed
PLAN_TASK: Final = "plan"  # its XCom: the hours to compute (JSON list of ISO hours)

# -- the backfill of a range, in chunks --------------------------------------------------------------------------
BACKFILL_DAG: Final = "trends_backfill"
CHUNKS_TASK: Final = "chunks"  # its XCom: the recompute's arguments per chunk (``--hours`` JSON list, flags)
START_PARAM: Final = "start"  # first hour (inclusive), ISO-8601 with an offset
END_PARAM: Final = "end"  # end (exclusive), a whole hour
ONLY_MISSING_PARAM: Final = "only_missing"  # skip hours that already have a current run
ACCEPT_LOSS_PARAM: Final = "accept_loss"  # compute hours that records lost before indexing may belong to

# -- an erasure's recompute of the hours holding an erased subject (privacy: `trends privacy forget --exclude`) -----
ERASURE_DAG: Final = "trends_erasure"
REQUEST_PARAM: Final = "request"  # the request's id in the erasure ledger (a hash: no personal data)
HOURS_PARAM: Final = "hours"  # the hours holding the subject's events (JSON list of ISO-8601 hours)
PURGE_TASK: Final = "purge"  # deletes the hours' superseded versions and speed rows; its XCom: the summary line

# -- tasks of both -----------------------------------------------------------------------------------------------
RECOMPUTE_TASK: Final = "recompute"  # the spark-submit of batch_layer/submit.py (mapped: one instance per chunk)
VERIFY_TASK: Final = "verify"  # the hourly DAG's reconciliation with the speed view
ADVANCE_TASK: Final = "advance_watermark"  # its XCom: the batch watermark line

DAG_IDS: Final = (BATCH_DAG, BACKFILL_DAG, ERASURE_DAG)


def is_chunk(task_id: str | None, map_index: int | None) -> bool:
    """Tell whether a task instance is one chunk of a backfill: an expanded instance of the mapped recompute.

    Before the chunks are known Airflow shows the mapped task once, unexpanded (``map_index`` -1): not a chunk.
    """
    return task_id == RECOMPUTE_TASK and (map_index if map_index is not None else -1) >= 0


# -- the recompute's command line (batch_layer/submit.py), as the DAGs pass it -----------------------------------
HOURS_ARG: Final = "--hours"
FORCE_ARG: Final = "--force"  # the sensor (or the chunks task) decided the hours are closed
NO_INDEX_ARG: Final = "--no-index"  # the DAG indexed just before
ACCEPT_LOSS_ARG: Final = "--accept-loss"


# -- where the installed package keeps them ----------------------------------------------------------------------
DAGS_PACKAGE: Final = "dags"
DAG_MODULE: Final = "dags.trends_batch"  # what a one-line DAG file imports (`trends admin dags --install`)


def _package_dir(package: str) -> Path:
    """Return the folder of an installed top-level package, found without importing it (no Airflow at parse)."""
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        msg = f"the package {package!r} is not installed with trends (a broken install?)"
        raise ModuleNotFoundError(msg)
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def dags_folder() -> Path:
    """Return the folder of the DAG files inside the installed package: Airflow's ``dags_folder`` points here."""
    return _package_dir(DAGS_PACKAGE)


def submit_script() -> Path:
    """Return the batch job's ``spark-submit`` entry point inside the installed package."""
    return _package_dir("batch_layer") / "submit.py"
