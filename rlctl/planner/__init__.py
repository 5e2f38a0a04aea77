"""The planner's parts; ``rlctl.planner.plan`` is its entry point (``make_plan``) and the home
of its public names. ``model``: the assumptions and the request and plan types;
``settings``: the request with the recipe's pinned keys; ``memory``: the memory model
and batch rules; ``fit``: one candidate layout; ``search``: the search over candidates;
``explain``: the plan assembled and explained; ``cpu``: the local CPU plan;
``multi_turn``: the response budget of multi-turn rollouts. What one module gives the
others is a public name of it; a leading underscore keeps a name in its own module
(tests/rlctl/test_import_graph.py)."""
