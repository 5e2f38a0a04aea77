"""Which keys each training role reads for its token budget and its Ulysses size: one
table for the config's rules (batches.py, train.py), its derived facts (engine.py) and
the engines that build the roles (engine.train.engines)."""

# Each role's (use_dynamic_bsz, max_token_len) keys; the actor's are the defaults.
TOKEN_BUDGET_KEYS = {
    "actor": (
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    ),
    "actor_log_prob": (
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    ),
    "ref_log_prob": (
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    ),
    "critic": ("critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu"),
}
# Which role's Ulysses size each token budget's micro-batches are split by.
BUDGET_ROLES = {
    "actor": "actor",
    "actor_log_prob": "actor",
    "ref_log_prob": "reference",
    "critic": "critic",
}
ULYSSES_KEYS = {
    "actor": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "reference": "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    "critic": "critic.ulysses_sequence_parallel_size",
}
