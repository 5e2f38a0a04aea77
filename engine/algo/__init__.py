"""The RL algorithm library: pure torch functions, each variant registered by name.

``names`` (torch-free) lists every variant; the registries live beside their
implementations: ``advantage.ADVANTAGE_ESTIMATORS``, ``policy_loss.POLICY_LOSSES``,
``aggregate.LOSS_AGGREGATIONS``, ``kl.KL_ESTIMATORS`` and ``kl.KL_CONTROLLERS``.
"""
