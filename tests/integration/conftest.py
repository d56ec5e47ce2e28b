"""Fixtures of the integration tests.

MongoDB: `mongo_uri` is mongo-java-server and, when MONGODB_URI names a replica set, that server too
(a test using it runs once against each); `mongo_db` a throwaway database on it. A module may
define its own `mongo_uri` (test_recovery_crash: mongo-java-server only).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from tests.mongo.server import mongo_java_server

LIVE_URI_ENV = "MONGODB_URI"


@pytest.fixture(scope="module", params=["mongo-java-server", "live"])
def mongo_uri(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "live":
        uri = os.environ.get(LIVE_URI_ENV)
        if not uri:
            pytest.skip(f"live MongoDB tests need {LIVE_URI_ENV} (a replica set URI); none is set")
        yield uri
    else:
        with mongo_java_server() as uri:
            yield uri


@pytest.fixture
def mongo_db(mongo_uri: str) -> Iterator[Any]:
    """A throwaway database (dropped at teardown)."""
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, tz_aware=True, serverSelectionTimeoutMS=10_000)
    name = f"cl_{secrets.token_hex(4)}"
    yield client[name]
    client.drop_database(name)
    client.close()
