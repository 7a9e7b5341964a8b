"""What a model must be: a user's linen or NNX module (or a shipped one) resolved by name,
built with its arguments and adapted to the step. Imports `base`, `parallel` and `zoo`."""
