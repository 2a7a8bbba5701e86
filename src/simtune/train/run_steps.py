"""The step floor of the encoder modes (`train.schedule.<top_layers|full>.min_run_steps`):
a run trains at least that many optimizer steps, each epoch passing over the training data
several times.

Why: max_epochs and patience count epochs, and an epoch of few-shot data is a few steps (16
questions per label of TREC's 6 coarse labels: 96 examples, batches of 32, 3 steps), so 4
epochs stop after 12 steps, long before the encoder has moved. The floor first raised
max_epochs (17 epochs of 3 steps); but each epoch is validated, and in full mode a validation
embeds the validation and training texts through the whole encoder: 18 validations were 14 of
the run's 50 s. Passes keep the validations at max_epochs + 1 (with frozen embeddings, 50 ->
32 s a run at the same P@1: docs/modes.md#full). Measured with the first form on TREC coarse
(`bench.small_data`, seeds 1 and 2): 16 epochs instead of 4 raised test P@1 at 16 per label from
0.752 to 0.795 and left 32 per label where it was (0.824 / 0.828). Data whose epochs are long
(TREC's 4,305 questions: 68 steps an epoch) is untouched.
"""

from __future__ import annotations

from simtune import params as P
from simtune.examples import batch_for
from simtune.params import TrainParams


def steps_per_epoch(t: TrainParams, n: int) -> tuple[int, int]:
    """(the batch an epoch of `n` training examples trains with, as `stage.fit_schedule` fits
    it; the optimizer steps of that epoch per process, over `t.devices` x `t.num_nodes`)."""
    batch, _ = batch_for(n, t.run.batch_size, t.min_steps, t.min_batch)
    return batch, max(1, -(-n // (batch * t.devices * t.num_nodes)))


def floor(t: TrainParams, n: int) -> TrainParams:
    """`t` with each epoch making as many passes over the training data as it takes for the
    run to train `min_run_steps` steps or more (`t.run.passes`), and why (`t.run.steps_reason`);
    `t` itself when its epochs already reach the floor, the floor is 0 or the mode has none
    (head, static). max_epochs and patience are left alone: the run validates (the cost of an
    epoch of few-shot data, whose training is a few steps) and may stop as often as it would
    without the floor."""
    want = getattr(getattr(t.schedule, t.mode, None), "min_run_steps", 0)
    batch, per_epoch = steps_per_epoch(t, n)
    if not want or t.run.max_epochs * per_epoch >= want:
        return t
    passes = -(-want // (t.run.max_epochs * per_epoch))
    why = (f"train.schedule.{t.mode}.min_run_steps {want}: a pass over the data is {per_epoch} "
           f"steps ({n} training examples, batch {batch}), so each of the {t.run.max_epochs} "
           f"epochs makes {passes} passes ({t.run.max_epochs * passes * per_epoch} steps at "
           "most)")
    return P.with_run(t, passes=passes, steps_reason=why)
