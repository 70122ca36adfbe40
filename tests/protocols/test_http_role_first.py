"""Protocol actions check the caller's role before looking anything up (issue 20, item 9).

A token whose role may never take an action used to get 404 for a protocol
that is not recorded and 403 for one that is, so any token could learn which
protocols exist. Now both answer the same 403; a role that may act still gets
404 for a protocol that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.contract.errors import NotFound, PermissionDenied
from tests.protocols.conftest import TOKENS, unique

ACTIONS = {  # verb: (a body the route accepts, a role that may never take it)
    "approve": ({"content_sha256": "0" * 64, "reason": "r"}, "rita-reviewer"),
    "start": ({"reason": "r"}, "dave-safety"),
    "stop": ({"reason": "r"}, "rita-reviewer"),
    "rollback-signal": ({"reason": "r"}, "alice-admin"),
}
MAY_ACT = {
    "approve": "dave-safety",
    "start": "alice-admin",
    "stop": "root-admin",
    "rollback-signal": "dave-safety",
}


@pytest.fixture()
def http(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=10) as client:
        yield client


def _post(http: httpx.Client, doc: dict[str, Any], verb: str, token: str) -> httpx.Response:
    return http.post(
        f"/v1/protocols/{doc['id']}/versions/{doc['version']}/{verb}",
        json=ACTIONS[verb][0],
        headers={"authorization": f"Bearer {token}"},
    )


@pytest.mark.parametrize("verb", list(ACTIONS))
@pytest.mark.parametrize("token", ["rt-runtime", "role-without-it"])
def test_a_role_without_the_action_gets_403_whether_or_not_the_protocol_exists(
    http: httpx.Client, online_doc: dict[str, Any], verb: str, token: str
) -> None:
    token = ACTIONS[verb][1] if token == "role-without-it" else token
    recorded = unique(online_doc)
    submitted = http.post(
        "/v1/protocols",
        json={"document": recorded},
        headers={"authorization": "Bearer alice-admin"},
    )
    assert submitted.status_code == 201, submitted.text
    missing = unique(online_doc)  # never submitted

    there = _post(http, recorded, verb, token)
    absent = _post(http, missing, verb, token)
    assert (there.status_code, absent.status_code) == (403, 403), (there.text, absent.text)
    assert there.json() == absent.json(), "the refusal must not depend on existence"
    # a malformed version or body is not read before the role either
    garbled = http.post(
        f"/v1/protocols/{missing['id']}/versions/not-a-number/{verb}",
        content=b"{not json",
        headers={"authorization": f"Bearer {token}"},
    )
    assert garbled.status_code == 403, garbled.text


@pytest.mark.parametrize("verb", list(MAY_ACT))
def test_a_role_that_may_act_still_gets_404_for_a_missing_protocol(
    http: httpx.Client, shadow_doc: dict[str, Any], verb: str
) -> None:
    response = _post(http, unique(shadow_doc), verb, MAY_ACT[verb])
    assert response.status_code == 404, response.text


@pytest.mark.parametrize("verb", sorted(ACTIONS))
def test_the_desk_itself_checks_the_role_before_the_lookup(desk: Any, verb: str) -> None:
    """Callers of the desk other than HTTP (the CLI, the evaluator) get the same order."""
    missing = "never-recorded"
    call = {
        "approve": lambda who: desk.approve(missing, 1, "0" * 64, who, "r"),
        "start": lambda who: desk.start(missing, 1, who, "r"),
        "stop": lambda who: desk.stop(missing, 1, who, "r"),
        "rollback-signal": lambda who: desk.signal_rollback(missing, 1, who, "r"),
    }[verb]
    with pytest.raises(PermissionDenied):
        call(TOKENS[ACTIONS[verb][1]])
    with pytest.raises(NotFound):  # a role that may act learns the version is not recorded
        call(TOKENS[MAY_ACT[verb]])
