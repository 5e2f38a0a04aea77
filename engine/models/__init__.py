"""Models built locally (no hub): a tiny model of each family and its tokenizer for tests
and the quickstart (``tiny``); the model families the Megatron backend converts, with
their shape rules for the planner (``families``)."""
