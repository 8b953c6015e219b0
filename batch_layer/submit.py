"""Entry point for ``spark-submit`` (the Airflow DAGs' recompute tasks): hours to compute, settings from TRENDS_*."""

from __future__ import annotations

import argparse
import json
import logging
from datetime import datetime

from batch_layer.job import run
from infra.dag_contract import ACCEPT_LOSS_ARG, FORCE_ARG, HOURS_ARG, NO_INDEX_ARG
from infra.settings import Settings


def main(argv: list[str] | None = None) -> None:
    """Recompute ``[--start, --end)`` or the ``--hours`` (a JSON list) with the settings of the environment."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--start", type=datetime.fromisoformat)
    parser.add_argument("--end", type=datetime.fromisoformat)
    parser.add_argument(HOURS_ARG, type=json.loads, help="JSON list of ISO hours (the hourly DAG's plan)")
    parser.add_argument(FORCE_ARG, action="store_true")
    parser.add_argument(NO_INDEX_ARG, action="store_true", help="the DAG indexed just before")
    parser.add_argument(ACCEPT_LOSS_ARG, action="store_true", help="accept records lost before indexing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    hours = [datetime.fromisoformat(h) for h in args.hours] if args.hours is not None else None
    if hours is None and (args.start is None or args.end is None):
        parser.error("give --start and --end, or --hours")
    results = run(
        Settings(),
        args.start,
        args.end,
        hours=hours,
        force=args.force,
        index_first=not args.no_index,
        accept_loss=args.accept_loss,
        progress=lambda p: print(p.line(), flush=True),
    )
    for result in results if len(results) <= 48 else results[-1:]:
        print(result.line())
    print(f"{len(results)} hours computed; batch watermark {results[-1].watermark if results else None}")


if __name__ == "__main__":
    main()
