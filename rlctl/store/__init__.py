"""What rlctl keeps of its jobs on this machine, and reads back for ``status``.

``jobs``: the SQLite job store (states, handles, transitions); ``progress``: where a run
is, read from its files or its bucket; ``memory_report``: the peaks against the plan.
"""
