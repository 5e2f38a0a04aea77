"""Supervised fine-tuning on chat conversations, verl's SFT trainer's command line:

    python -m engine.sft data.train_files=train.parquet model.path=Qwen/Qwen2.5-0.5B-Instruct ...

The loss is the token-mean negative log-likelihood of the assistant's tokens only
(every turn of a multi-turn conversation, tool calls included), over the whole global
batch. The run is the RL engine's machinery with one role: the driver reads and
tokenizes the conversations, batches them, and drives a group of Ray worker processes
(``engine.workers.host.WorkerHost``) that hold the ``sft`` role
(``engine.workers.sft.SFTWorker``: the FSDP2 or Megatron training engine of
``engine.train.engines``, LoRA and packing included); checkpoints, exact resumption,
trackers, the hang watchdog and export are the RL trainer's.

    conversation.py   messages -> token ids and the assistant's loss mask
    dataset.py        parquet/jsonl files -> tokenized conversations
    batches.py        conversations -> the TokenBatch the training engines take
    trainer.py        the loop: steps, validation loss, checkpoints, resume
    runtime.py        Ray, the workers, the data, the trackers; then the loop
    cli.py            the command line (``--check``, ``--help KEY``, Hydra's grammar)

docs/sft.md says what runs, which keys, and why Ray workers rather than torchrun.
"""
