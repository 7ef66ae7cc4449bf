"""Typed failures of policy backends (broken infrastructure, never model behaviour)."""

from __future__ import annotations


class PolicyError(RuntimeError):
    """A policy backend cannot serve the call (model missing, bad adapter, invalid request)."""


class PolicyHTTPError(PolicyError):
    """The OpenAI-compatible server failed: connection refused, timeout, 4xx/5xx or malformed JSON.

    ``status`` is the HTTP status code (``None`` when no response arrived); ``url`` the endpoint called.
    """

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
