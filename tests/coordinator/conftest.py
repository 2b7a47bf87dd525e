"""The loader has two paths to the same state: the compiled ``storage.loadcodec`` (when the install
built it) and the pure-Python readers. Load tests use ``both_loader_paths`` to run once per path."""

import pytest

import storage.batch
from storage import loadcodec


@pytest.fixture(params=["compiled", "pure"])
def both_loader_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "compiled" and not loadcodec.COMPILED:
        pytest.skip("this install has no compiled loadcodec")
    monkeypatch.setattr(storage.batch, "FAST_REPLAY", request.param == "compiled")
    return str(request.param)
