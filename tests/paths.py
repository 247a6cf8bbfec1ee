"""Where the checkout keeps the test suite's state: its PostgreSQL (.rota/test), the
migration test's diffs, crash databases and screenshots. rota itself keeps its state under
ROTA_HOME, or .rota/ in the directory it runs in."""

from pathlib import Path

CHECKOUT_STATE = Path(__file__).resolve().parents[1] / ".rota"
