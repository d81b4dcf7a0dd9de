"""A Hugging Face ``Trainer`` script with the reporter as a ``TrainerCallback``: a tiny GPT-2 on the
bytes of Python's ``pydoc_data.topics``, evaluated at the end. ``examples/hf_trainer/protocol.yaml``
compares ``--optim adamw_torch`` (foreach AdamW) with ``--optim adamw_torch_fused``.

The callback is the whole change a Trainer script needs: each logged step (``logging_steps=1``)
is a reported step, and the final evaluation runs off the training clock::

    cb = ReporterCallback(args.out)       # the reporter starts when training begins
    trainer = Trainer(..., callbacks=[cb])
    trainer.train()
    r = cb.r
    with r.untimed():
        r.eval(steps, {"eval_loss": trainer.evaluate()["eval_loss"]})
    r.done()

    python examples/hf_trainer/train.py --seed 1 --steps 8
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pydoc_data.topics import topics

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from harness.reporter import Reporter


class ReporterCallback(TrainerCallback):
    """Each logged training step to the harness's reporter (with ``logging_steps=1``: every step).
    The reporter is built when training begins, so the Trainer's set-up is off the clock."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.r: Reporter | None = None

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - the Trainer's signature
        self.r = Reporter.from_env(self.path)

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001 - the Trainer's signature
        if self.r is not None and logs and "loss" in logs:
            self.r.step(state.global_step, logs["loss"])


class Bytes(torch.utils.data.Dataset):
    def __init__(self, data: bytes, ctx: int, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.rows = [t[i : i + ctx] for i in torch.randint(len(t) - ctx, (n,), generator=g).tolist()]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--optim", default="adamw_torch_fused")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    data = "\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    cut = int(0.95 * len(data))
    ctx = 32
    train = Bytes(data[:cut], ctx, 8 * args.steps, args.seed)
    valid = Bytes(data[cut:], ctx, 16, 0)
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=ctx, n_embd=32, n_layer=2, n_head=2))
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=8,
            per_device_eval_batch_size=8,
            learning_rate=3e-3,
            optim=args.optim,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            seed=args.seed,
            data_seed=args.seed,
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        cb = ReporterCallback(args.out)
        trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=valid, callbacks=[cb])
        trainer.train()
        r = cb.r
        assert r is not None
        with r.untimed():
            loss = trainer.evaluate()["eval_loss"]
            r.eval(args.steps, {"eval_loss": loss})
            print(f"eval_loss {loss:.4f}", flush=True)
        r.done()


if __name__ == "__main__":
    main()
