"""The launcher tests' stand-in trainer (`launching.stand_in`)."""

import pytest

from tests.elastic import launching


@pytest.fixture
def stand_in(tmp_path):
  return launching.stand_in(tmp_path)
