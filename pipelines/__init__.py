import warnings

from dagster import BetaWarning

# Single-run backfills are what make a selected range one run; Dagster still labels the
# parameter beta and would warn once per asset at every code-location load.
warnings.filterwarnings("ignore", category=BetaWarning, message=".*backfill_policy.*")
