from pathlib import Path

import pytest

TESTS = Path(__file__).parent
ENGINE_FIXTURES = TESTS / "fixtures" / "engines"


@pytest.fixture
def engine_page():
    """The text of a real engine /metrics capture (tests/fixtures/engines, copied from shared/fixtures)."""

    def read(name: str) -> str:
        return (ENGINE_FIXTURES / name).read_text()

    return read
