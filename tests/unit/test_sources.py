"""The sources' conventions and settings."""

from datetime import date

import pytest

from rota.pipelines.sources import sources
from rota.pipelines.sources.github import issue_ref
from rota.pipelines.sources.nightly import nightly_ref
from rota.resources.maintenance import MaintenanceSettings


def test_each_sources_ref_convention_is_pinned():
    assert nightly_ref(date(2026, 12, 2)) == "nightly/2026-12-02"
    assert issue_ref("octo/cat", 7) == "octo/cat#7"
    assert {name: (s.job_name, s.ref_convention) for name, s in sources().items()} == {
        "nightly": ("nightly-maintenance", "nightly/YYYY-MM-DD"),
        "github": ("github-issue", "owner/repo#number"),
    }


def test_a_retention_below_a_day_is_refused():
    with pytest.raises(Exception, match="retention_days must be at least 1, not 0"):
        MaintenanceSettings(retention_days=0)
