"""What a model must be: a user's linen or NNX module (or a shipped one) resolved by name,
built with its arguments and adapted to the step.

`source` (what `config.model` or a Python object names), `modeling` (building it), `adapter`
(the `Model` the step calls), `intercept` (linen's Dropout and BatchNorm in training),
`nnx_layers` (NNX modules through the bridge), `probe` (the trace before anything starts).
Imports `base`, `parallel`, `trace` (the context its `Model.apply` sets) and `zoo`."""
