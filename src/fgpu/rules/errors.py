"""Refusals of the request rules and the service, for an API to turn into 4xx answers."""

from __future__ import annotations


class ServiceError(Exception):
    """A refusal with an HTTP status, the field concerned and the reason, for users."""

    status = 400

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class BadRequest(ServiceError):
    """Invalid input (422)."""

    status = 422


class NotFoundError(ServiceError):
    """No such workload, queue or node (404)."""

    status = 404


class Forbidden(ServiceError):
    """The caller may not do this (403)."""

    status = 403


class Conflict(ServiceError):
    """The object is not in a state that allows this (409)."""

    status = 409


class InsufficientStorage(ServiceError):
    """The service cannot store the change now: its disk is full or its database cannot
    write (507, RFC 4918 section 11.5); the reason says which and what is free."""

    status = 507


class Unavailable(ServiceError):
    """The service is too busy for this now (503); ``retry_after_s`` goes in the answer's
    ``Retry-After`` header (RFC 9110 section 10.2.3)."""

    status = 503

    def __init__(self, field: str, reason: str, retry_after_s: int = 1) -> None:
        super().__init__(field, reason)
        self.retry_after_s = retry_after_s


class DamagedRecord(ServiceError):
    """The workload's stored row is damaged (409): the reason names the id, what is wrong
    and how an admin ends it."""

    status = 409
