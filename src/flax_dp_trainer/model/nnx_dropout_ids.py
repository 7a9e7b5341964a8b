"""The example ids of the batch being applied, for NNX Dropout layers (`nnx_dropout.py`): NNX
has no method interceptors, and the user's module calls its Dropout with its own arguments
(without them, test_user_model.py's per-example test of NnxNet fails). Set by the adapter
around each application (`adapter.py`); without NNX, so that linen runs start without it."""

import contextvars

EXAMPLE_IDS = contextvars.ContextVar('example_ids', default=None)
