import os
from typing import Optional

from dagster import ConfigurableResource, EnvVar


class GitHubResource(ConfigurableResource):
    """Where the GitHub Source polls. The token comes from ROTA_GITHUB_TOKEN through an
    EnvVar, so Dagster shows the variable's name, never its value."""

    token: Optional[str] = None
    api_url: str = "https://api.github.com"
    repositories: str = ""
    timeout_seconds: float = 10.0
    # A poll runs inside a sensor evaluation, which Dagster times out after 60 s by default.
    poll_budget_seconds: float = 40.0

    def repository_list(self) -> list[str]:
        repos = [r.strip() for r in self.repositories.split(",") if r.strip()]
        for repo in repos:
            owner, _, name = repo.partition("/")
            if not owner or not name or "/" in name:
                raise ValueError(f"GitHub repository {repo!r} is not owner/name")
        return repos


def github_from_env() -> GitHubResource:
    return GitHubResource(
        token=EnvVar("ROTA_GITHUB_TOKEN") if os.environ.get("ROTA_GITHUB_TOKEN") else None,
        api_url=os.environ.get("ROTA_GITHUB_API_URL", "https://api.github.com"),
        repositories=os.environ.get("ROTA_GITHUB_REPOSITORIES", ""),
    )
