"""Routing of the rollout server: which handler, 404 or 405 answers each method and path."""

from __future__ import annotations

import pytest

from tests.rollout.server.conftest import ServeFactory

#: (method, path) -> (status, detail) without a lease header; a handler reached without
#: a lease answers 422 naming the header, so 422 proves the route was found.
NO_LEASE = "missing X-Osmosis-Rollout-Lease header; send the polling_lease_token"
ROUTES: list[tuple[str, str, int, str | None]] = [
    ("GET", "/health", 200, None),
    ("POST", "/health", 405, "Method Not Allowed"),
    ("GET", "/health/", 404, "Not Found"),
    ("GET", "/rollout", 405, "Method Not Allowed"),
    ("POST", "/rollout/", 404, "Not Found"),
    ("GET", "/rollout/cancel", 405, "Method Not Allowed"),
    ("GET", "/rollout/r1/result", 422, NO_LEASE),
    ("GET", "/rollout/r1/preview", 422, NO_LEASE),
    ("GET", "/rollout/cancel/result", 422, NO_LEASE),  # "cancel" is a valid rollout id here
    ("POST", "/rollout/r1/result", 405, "Method Not Allowed"),
    ("DELETE", "/rollout/r1/preview", 405, "Method Not Allowed"),
    ("GET", "/rollout/result", 404, "Not Found"),
    ("GET", "/rollout//result", 404, "Not Found"),
    ("POST", "/rollout//result", 404, "Not Found"),  # a malformed id is 404 before 405
    ("GET", "/rollout/a/b/result", 404, "Not Found"),
    ("GET", "/rollout/r1/result/", 404, "Not Found"),
    ("GET", "/rollout/r1", 404, "Not Found"),
    ("GET", "/rollout/r1/other", 404, "Not Found"),
    ("GET", "/nope", 404, "Not Found"),
    ("GET", "/", 404, "Not Found"),
]


@pytest.mark.parametrize(
    ("method", "path", "status", "detail"),
    ROUTES,
    ids=[f"{method} {path}" for method, path, _, _ in ROUTES],
)
async def test_route_answers(
    serve: ServeFactory, method: str, path: str, status: int, detail: str | None
) -> None:
    async with serve() as server:
        response = await server.http.request(method, path)
    assert response.status_code == status, response.text
    if detail is not None:
        assert response.json() == {"detail": detail}


async def test_path_parameter_reaches_the_handler(serve: ServeFactory) -> None:
    async with serve() as server:
        lease = {"X-Osmosis-Rollout-Lease": "not-the-lease"}
        admitted = await server.admit("r-7.x:y")
        wrong = await server.http.get("/rollout/r-7.x:y/result", headers=lease)
        unknown = await server.http.get("/rollout/r-8/preview", headers=lease)
    assert admitted.status_code == 202
    assert (wrong.status_code, wrong.json()) == (403, {"detail": "invalid polling lease"})
    assert (unknown.status_code, unknown.json()) == (404, {"detail": "unknown rollout_id"})


async def test_authentication_comes_before_routing(serve: ServeFactory) -> None:
    async with serve(api_key="server-key-1") as server:
        for method, path in (("GET", "/nope"), ("POST", "/health"), ("GET", "/health")):
            response = await server.http.request(
                method, path, headers={"Authorization": "Bearer wrong"}
            )
            assert (response.status_code, response.json()) == (401, {"detail": "unauthorized"})
