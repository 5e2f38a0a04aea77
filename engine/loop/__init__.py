"""The controller's loop: one RL step after another, on workers that are up.

``trainer`` runs the steps (generate, score, compute advantages, update, sync weights,
validate, checkpoint); ``overlap`` holds how generation and training take turns (the
synchronous mode among them), ``fully_async`` and ``rollouter`` the fully asynchronous
one; ``generate``, ``scoring``, ``distill``, ``balance``, ``validation`` and
``generations`` are the steps' parts; ``batch`` the controller's batch, ``metrics`` the
step's metrics, ``weights_version`` the one holder of the actor's weights version.
Starting a run (Ray, the workers, data, trackers) is ``engine.runtime``'s; the Ray
plumbing under the loop is ``engine.controller``'s.
"""
