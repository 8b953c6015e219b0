"""Entry point for ``spark-submit`` (the Airflow DAG's recompute task): one interval, settings from TRENDS_*."""

from __future__ import annotations

import argparse
import logging
from datetime import datetime

from batch_layer.job import run
from infra.settings import Settings


def main(argv: list[str] | None = None) -> None:
    """Recompute ``[--start, --end)`` with the settings of the environment."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--start", required=True, type=datetime.fromisoformat)
    parser.add_argument("--end", required=True, type=datetime.fromisoformat)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for result in run(Settings(), args.start, args.end, force=args.force):
        print(result.line())


if __name__ == "__main__":
    main()
