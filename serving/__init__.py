"""Serving: merge the batch and speed views and answer queries over HTTP, the CLI and the dashboard."""
