from typing import Optional

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from rota.resources.settings import read_environment


class GitHubResource(ConfigurableResource):
    """Where the GitHub Source polls. The token comes from ROTA_GITHUB_TOKEN through an
    EnvVar, so Dagster shows the variable's name, never its value."""

    token: Optional[str] = Field(default=None, description="the GitHub Source's token",
                                 json_schema_extra={"env": "ROTA_GITHUB_TOKEN", "secret": True})
    api_url: str = Field(default="https://api.github.com", description="the GitHub API the Source polls",
                         json_schema_extra={"env": "ROTA_GITHUB_API_URL"})
    repositories: str = Field(default="", description="owner/name,... the GitHub Source polls (unset: none)",
                              json_schema_extra={"env": "ROTA_GITHUB_REPOSITORIES"})
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
    return GitHubResource(**read_environment(GitHubResource, secret=EnvVar))
