"""The tests. They import the installed package (`flax_dp_trainer`, from `src/`); `REPO` is
the checkout, for the tests' own files (`tests/user_models.py`, ...) and its `launch/`."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
