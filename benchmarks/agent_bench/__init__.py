"""The parts of benchmarks/agent_tools.py: tool calls through ``execute``
(``tool_calls``), the agent loop on a rollout engine in a process of its own
(``rollout_run``, with the forced first turn in ``forced``), what the rest of the machine
did meanwhile (``cpu``) and the printed report (``report``)."""
