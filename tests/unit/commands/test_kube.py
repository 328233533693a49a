from dra_gpu.kube.client import _query_value
from dra_gpu.kube.errors import ApiError


def test_api_error_names_request_status_and_server_message() -> None:
    err = ApiError(
        "GET", "/api/v1/nodes/x", 404, {"reason": "NotFound", "message": 'nodes "x" not found'}
    )
    assert err.not_found
    assert not err.conflict
    assert str(err) == 'GET /api/v1/nodes/x: 404 NotFound: nodes "x" not found'


def test_api_error_keeps_a_non_json_body() -> None:
    err = ApiError("POST", "/p", 500, "boom")
    assert str(err) == "POST /p: 500 : boom"


def test_query_values_are_strings_and_booleans_lowercase() -> None:
    assert [_query_value(v) for v in (True, False, 5, "a")] == ["true", "false", "5", "a"]
