"""The API app that ``trends serve`` serves: serving's app with the routes of the layers above serving mounted in.

Serving may not import the other layers (import-linter), so the command root composes: the query API and
dashboard of :func:`serving.api.create_app`, plus erasure's routes (:func:`privacy.api.router`), under the same
API token, concurrency limit and metrics middleware.
"""

# No `from __future__ import annotations`: FastAPI reads annotations at runtime.
import logging

from fastapi import FastAPI

from infra.settings import Settings
from privacy.api import mount as mount_privacy
from serving.api import create_app as create_serving_app
from serving.cli import serve_command

logger = logging.getLogger(__name__)


def create_app(settings: Settings) -> FastAPI:
    """Build the served app for these settings: the query API and dashboard, and erasure's routes."""
    app = create_serving_app(settings)
    mount_privacy(app, settings)
    return app


def app_from_env() -> FastAPI:
    """Build the app from ``TRENDS_*`` variables (the factory of each worker of ``trends serve --workers N``)."""
    return create_app(Settings())


serve = serve_command(__name__)
