"""Protocol test fixtures: example documents, identities, a store, a real HTTP server.

HTTP tests share one uvicorn server and one database per module (each test
uses its own protocol ids), to stay lean on two shared cores.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import Engine

from service.contract.errors import InvalidInput, Unauthenticated, UnderstudyError
from service.protocols import (
    ActorRole,
    Identity,
    LoggingProfile,
    PolicyRef,
    ProtocolDesk,
)
from service.server.policy_refs import policy_refs_from_directory
from service.server.runtime import bind_socket
from service.storage import (
    EmbeddedPostgres,
    create_database,
    drop_database,
    make_engine,
)
from service.storage.stores.protocol import ProtocolStore
from service.transport.http.app import status_for
from service.transport.http.models import ErrorModel
from service.transport.http.protocols import protocol_router
from tests.pg_fixtures import TEMPLATE

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS_DIR = REPO / "protocols"
SHADOW_FILE = PROTOCOLS_DIR / "gavel-scorer-shadow.yaml"
ONLINE_FILE = PROTOCOLS_DIR / "gavel-scorer-online.yaml"
STOCHASTIC = LoggingProfile(decisions=500, with_propensity=500, deterministic=40, window="test")
DETERMINISTIC = LoggingProfile(decisions=500, with_propensity=500, deterministic=500)
NO_PROPENSITIES = LoggingProfile(decisions=500, with_propensity=0, deterministic=0)

TOKENS: dict[str, Identity] = {
    "alice-admin": Identity("alice", ActorRole.ADMIN),  # owner of both examples
    "alice-safety": Identity("alice", ActorRole.SAFETY),  # an owner who also holds safety
    "bob-admin": Identity("bob", ActorRole.ADMIN),  # owner of the shadow example only
    "root-admin": Identity("root", ActorRole.ADMIN),  # an admin who owns nothing
    "dave-safety": Identity("dave", ActorRole.SAFETY),  # independent safety reviewer
    "rita-reviewer": Identity("rita", ActorRole.REVIEWER),
    "rt-runtime": Identity("runtime-1", ActorRole.RUNTIME),
}
_ids = itertools.count(1)


def identify(authorization: str | None) -> Identity:
    """Stand-in for the proposed `TokenAuthority.identify` (token -> principal and role)."""
    if not authorization:
        raise Unauthenticated("`authorization` header is missing; send `Bearer <token>`")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or token.strip() not in TOKENS:
        raise Unauthenticated("`authorization` token is not recognised")
    return TOKENS[token.strip()]


def load_doc(path: Path) -> dict[str, Any]:
    """A protocol file as the mapping the parser reads."""
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="session")
def refs() -> dict[str, PolicyRef]:
    """Registered policies as the shipped `policies/` folder gives them."""
    return policy_refs_from_directory(REPO / "policies")


@pytest.fixture()
def shadow_doc() -> dict[str, Any]:
    """A fresh copy of the shadow example, free to mutate."""
    return copy.deepcopy(load_doc(SHADOW_FILE))


@pytest.fixture()
def online_doc() -> dict[str, Any]:
    """A fresh copy of the online-bounded example."""
    return copy.deepcopy(load_doc(ONLINE_FILE))


def unique(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` under an id no other test in the session uses."""
    out = copy.deepcopy(doc)
    out["id"] = f"{doc['id']}-t{next(_ids)}"
    return out


@pytest.fixture()
def store(db_url: str) -> Iterator[ProtocolStore]:
    """A store on this test's fresh database."""
    engine = make_engine(db_url)
    yield ProtocolStore(engine)
    engine.dispose()


def make_desk(
    store: ProtocolStore,
    refs: dict[str, PolicyRef],
    logging: LoggingProfile | None = STOCHASTIC,
) -> ProtocolDesk:
    """A desk whose environment is the shipped policies and a stochastic production."""
    return ProtocolDesk(store, policies=lambda: refs, logging=lambda: logging)


@pytest.fixture()
def desk(store: ProtocolStore, refs: dict[str, PolicyRef]) -> ProtocolDesk:
    return make_desk(store, refs)


@pytest.fixture(scope="module")
def module_engine(pg_server: EmbeddedPostgres) -> Iterator[Engine]:
    """One migrated database for a whole module (its tests use distinct protocol ids)."""
    name = f"protocols_{next(_ids)}"
    url = create_database(pg_server.url(), name, template=TEMPLATE)
    engine = make_engine(url)
    yield engine
    engine.dispose()
    drop_database(pg_server.url(), name)


def build_app(desk: ProtocolDesk) -> FastAPI:
    """The protocol router plus the same error handler as `create_http_app`."""
    app = FastAPI()

    @app.exception_handler(UnderstudyError)
    async def _on_error(_: Request, exc: UnderstudyError) -> JSONResponse:
        body = ErrorModel(
            error=type(exc).__name__,
            field=exc.field if isinstance(exc, InvalidInput) else None,
            message=str(exc),
        )
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthenticated) else None
        return JSONResponse(body.model_dump(), status_code=status_for(exc), headers=headers)

    app.include_router(protocol_router(desk, identify))
    return app


@pytest.fixture(scope="module")
def server_url(module_engine: Engine, refs: dict[str, PolicyRef]) -> Iterator[str]:
    """A real uvicorn on loopback serving the protocol routes."""
    desk = make_desk(ProtocolStore(module_engine), refs)
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn.Config(build_app(desk), log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="http", daemon=True
    )
    thread.start()
    waiter = threading.Event()
    while not server.started:
        assert thread.is_alive(), "uvicorn died"
        waiter.wait(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(5)
    sock.close()


@pytest.fixture()
def fresh_id() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """`unique`, as a fixture."""
    return unique
