"""The planner's parts; ``rlctl.planner.plan`` is its entry point (``make_plan``) and the home
of its public names. ``model``: the assumptions and the request and plan types;
``settings``: the request with the recipe's pinned keys; ``memory``: the memory model
and batch rules; ``fit``: one candidate layout; ``search``: the search over candidates;
``explain``: the plan assembled and explained; ``cpu``: the local CPU plan;
``multi_turn``: the response budget of multi-turn rollouts. Names with a
leading underscore are shared within the planner only."""
