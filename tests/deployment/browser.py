"""The deployment's UI in a browser: signing in as a person does, through Airflow's own login form."""

from __future__ import annotations

from urllib.parse import quote

from playwright.sync_api import Page

from olmocr_testkit.cluster import ADMIN_USER, Deployment


def log_in(page: Page, deployment: Deployment, next_path: str = "/") -> None:
    """Sign in through Airflow's own login form (the simple auth manager's admin user)."""
    page.goto(f"{deployment.cluster.api_url}/auth/login?next={quote(next_path, safe='')}")
    page.fill("input[name=username]", ADMIN_USER)
    page.fill("input[name=password]", deployment.cluster.admin_password)
    page.locator("button[type=submit]").click()
    page.wait_for_url(lambda url: "/auth/login" not in url, timeout=120_000)
