"""`python -m benchmarks`: every benchmark case, run from a checkout (minutes; never in CI).

Prints each case with its ratio against a baseline measured in the same run, on a scratch
database."""

import argparse
import sys

from benchmarks.bench import main

parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--duties", type=int, default=1_000_000)
parser.add_argument("--backfill-duties", type=int, default=100_000)
parser.add_argument("--queue-runs", type=int, default=100_000)
parser.add_argument("--repeat", type=int, default=3)
parser.add_argument("--history-days", type=int, default=365, help="history before the night of `year`")
parser.add_argument("--year-duties", type=int, default=100_000, help="daily duties of `year`")
parser.add_argument("--tenant-duties", type=int, default=100_000, help="daily duties of `tenants`")
parser.add_argument("--only", help="comma-separated: dispatch,foreign_key,year,backfill,planner,memory,enqueue,queue,dagster,tenants")
args = parser.parse_args()
sys.exit(main(duties=args.duties, backfill_duties=args.backfill_duties, queue_runs=args.queue_runs,
              repeat=args.repeat, only=args.only.split(",") if args.only else None,
              history_days=args.history_days, year_duties=args.year_duties,
              tenant_duties=args.tenant_duties))
