"""The SFT loop, run by the single controller (verl's ``SFTTrainer.fit``, its semantics):

    for each step: the next batch of conversations ─► the workers' optimizer step ─► metrics
                   ─► the validation loss (every test_freq steps and after the last)
                   ─► a checkpoint (every save_freq steps and after the last) ─► the loggers

The batches come from the RL trainer's loader (``engine.data.loader.PromptLoader``: each
epoch a permutation of its own seed, resumable to the batch), so a run resumed from a
checkpoint continues with exactly the batches, weights, optimizer state and random state
the uninterrupted run had. SIGTERM ends the run after its step, saving first
(``trainer.preemption_save_steps``), with exit code 75 (``engine.loop.trainer.Preempted``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.checkpoint import CheckpointManager, TrainerState, read_trainer_state
from engine.config.sft import resolved_freq
from engine.config.sft_sections import SFTConfig
from engine.data.loader import PromptLoader
from engine.errors import EngineError
from engine.loop.metrics import StageTimer, reduce_rank_metrics, throughput_metrics
from engine.loop.trainer import Preempted
from engine.sft.batches import chunks, evenly, token_batch
from engine.sft.conversation import Conversation
from engine.sft.dataset import ConversationDataset
from engine.tracking import Tracker

TOTAL_TOKENS = "total_tokens"  # in the trainer state's extra: tokens trained on so far
# ``stop(step, metrics)``: a caller's rule to end the run early (engine.warmup.secret)
StopRule = Callable[[int, dict[str, float]], bool]


class SFTTrainer:
    def __init__(
        self,
        cfg: SFTConfig,
        workers: Any,
        pad_token_id: int,
        loader: PromptLoader,
        val: ConversationDataset | None,
        tracker: Tracker,
        checkpoints: CheckpointManager,
        config_yaml: str,
        total_steps: int,
        resume_from: str | None = None,
        stop: StopRule | None = None,
    ) -> None:
        self.cfg = cfg
        self.workers = workers
        self.pad_token_id = pad_token_id
        self.loader = loader
        self.val = val
        self.tracker = tracker
        self.checkpoints = checkpoints
        self.config_yaml = config_yaml
        self.total_steps = total_steps
        self.resume_from = resume_from
        self.stop = stop
        self.step = 0
        self.total_tokens = 0
        self.stop_requested = False
        per_epoch = len(loader)
        self.save_freq = resolved_freq(cfg.trainer.save_freq, per_epoch)
        self.test_freq = resolved_freq(cfg.trainer.test_freq, per_epoch)
        self._batches = iter(loader)

    def fit(self) -> None:
        if self.resume_from is not None:
            self.resume(self.resume_from)
        while self.step < self.total_steps:
            self.step += 1
            metrics = self.train_step()
            last = self.step == self.total_steps
            if self.val is not None and (last or self._every(self.test_freq)):
                metrics |= self.validate()
            problem = self.update_problem(metrics)
            stopping = self.stop is not None and self.stop(self.step, metrics)
            if problem is None and (last or stopping or self._every(self.save_freq)):
                self.save()
            self.tracker.log(self.step, metrics)
            if problem:
                raise EngineError(problem)
            self.checkpoints.finish_uploads(self.workers, block=False)
            if stopping:
                break
            if self.stop_requested:
                self.stop_for_preemption()
        self.checkpoints.finish_uploads(self.workers, block=True)

    def _every(self, freq: int) -> bool:
        return freq > 0 and self.step % freq == 0

    def next_batch(self) -> list[Conversation]:
        """The next batch; a new epoch starts when one runs out."""
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = iter(self.loader)
            return next(self._batches)

    def train_step(self) -> dict[str, float]:
        timer = StageTimer()
        with timer("step"):
            tokens = token_batch(self.next_batch(), self.pad_token_id)
            with timer("update"):
                metrics = self.workers.call_split(
                    "sft", "train_batch", tokens, gather=reduce_rank_metrics
                )
        num_tokens = int(tokens.attention_mask_BS.sum())
        self.total_tokens += num_tokens
        metrics |= timer.metrics()
        metrics |= throughput_metrics(
            num_tokens, timer.seconds["step"], self.cfg.trainer.world_size
        )
        metrics["train/global_tokens"] = float(num_tokens)
        metrics["train/total_tokens(B)"] = self.total_tokens / 1e9
        metrics["train/epoch"] = float(self.loader.epoch)
        return metrics

    def validate(self) -> dict[str, float]:
        """The token-mean NLL of every validation conversation's assistant tokens, under
        the current weights (over the whole set, not a mean of batch means)."""
        assert self.val is not None
        timer = StageTimer()
        nll = tokens = 0.0
        ranks = self.cfg.data_parallel_size
        with timer("val"):
            for rows in chunks(len(self.val), self.cfg.data.train_batch_size):
                batch = evenly([self.val[i] for i in range(rows.start, rows.stop)], ranks)
                for part in self.workers.call_split(
                    "sft", "nll", token_batch(batch, self.pad_token_id), gather=list
                ):
                    nll, tokens = nll + part["nll"], tokens + part["tokens"]
        return {"val/loss": nll / max(tokens, 1.0), "timing_s/val": timer.seconds["val"]}

    def update_problem(self, metrics: dict[str, float]) -> str | None:
        """Why the run must stop: steps with a NaN/inf gradient norm, over and over (each
        is skipped and counted, so one bad batch does not end a run)."""
        in_a_row = metrics.get("train/consecutive_skipped_updates", 0.0)
        limit = self.cfg.trainer.max_consecutive_skipped_updates
        if in_a_row < limit:
            return None
        return (
            f"{int(in_a_row)} steps in a row had a NaN/inf loss or gradient norm"
            f" (trainer.max_consecutive_skipped_updates={limit}); the last good checkpoint"
            " is intact. Lower optim.lr, or clip harder (optim.clip_grad)"
        )

    # -- checkpoints and faults ---------------------------------------------

    def save(self) -> None:
        state = TrainerState(
            step=self.step,
            loader=self.loader.state_dict(),
            kl_ctrl={},
            extra={TOTAL_TOKENS: self.total_tokens},
        )
        self.checkpoints.save(self.step, self.workers, state, self.config_yaml)
        if "hf_model" in self.cfg.checkpoint.save_contents and not self.checkpoints.remote:
            from engine.checkpoint import step_dir
            from engine.export import export_checkpoint

            saved = self.checkpoints.local_root / step_dir(self.step)
            export_checkpoint(str(saved), saved / "huggingface", role="sft")

    def resume(self, path: str) -> None:
        """Continue exactly where checkpoint ``path`` left off."""
        state = read_trainer_state(path)
        local = self.checkpoints.fetch(path, self.workers)
        self.workers.host_all("load_checkpoint", local)
        self.step = state.step
        self.total_tokens = int(state.extra.get(TOTAL_TOKENS, 0))
        self.loader.load_state_dict(state.loader)
        self._batches = iter(self.loader)
        self.checkpoints.last_saved_step = state.step
        print(f"resumed from {path} at step {state.step}", flush=True)

    def request_stop(self) -> None:
        """Called from the SIGTERM handler: finish this step, then stop."""
        self.stop_requested = True

    def stop_for_preemption(self) -> None:
        since = self.step - self.checkpoints.last_saved_step
        wanted = self.cfg.trainer.preemption_save_steps
        if wanted > 0 and since >= wanted:
            self.save()
        self.checkpoints.finish_uploads(self.workers, block=True)
        raise Preempted(self.step)
