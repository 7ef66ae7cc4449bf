from __future__ import annotations

import pytest

from tests.train.train_fixtures import make_episodes, tiny_llama


@pytest.fixture
def model():
    return tiny_llama()


@pytest.fixture
def episodes():
    return make_episodes()
