"""Loader processes feeding numpy batches to one trainer through one lava-flow fan-in channel.

    python examples-python/data_loader.py [--loaders N] [--batches B] [--batch-size S]

As PyTorch's DataLoader with `num_workers=N` does, batch i is made by loader i % N, and the
trainer takes the batches in index order whatever order they arrive in. The N loaders (separate
processes, started with multiprocessing's spawn) are the producers of ONE fan-in channel: each
writes its batches straight into the channel's shared memory (a loan: no copy), tagged with the
batch index; the trainer receives them all on its one consumer end, reads each where it lies
(numpy.frombuffer over the message: no copy), learns which loader sent it from
`Message.producer` (the loader's slot), and holds a batch that came early until its turn.
It fits a linear model with SGD, printing the loss as it falls, and stops once every loader's
end was reported (a PeerGoneError naming its slot) and every batch was trained on.
"""
import argparse
import multiprocessing as mp
import os
import uuid

import numpy as np

import lava_flow as lf

FEATURES = 16
TRUE_W = np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32)
HEADER = 8  # the batch index, a uint64, before the batch's float32 rows


def batch_bytes(batch_size):
    return HEADER + batch_size * (FEATURES + 1) * 4


def loader(channel_name, loader_id, loaders, batches, batch_size):
    ctx = lf.Context(gpu="disabled")
    with lf.producer(ctx, channel_name, kind="fan_in", max_peers=loaders, capacity=8) as ch:
        for index in range(loader_id, batches, loaders):
            # Each batch drawn from its index alone: the same data whatever the number of loaders.
            rng = np.random.default_rng(index)
            with ch.loan(batch_bytes(batch_size)) as loan:
                # The index and the features and labels laid out in the loaned shared memory itself.
                np.frombuffer(loan, dtype=np.uint64, count=1)[0] = index
                block = np.frombuffer(loan, dtype=np.float32, offset=HEADER).reshape(batch_size, FEATURES + 1)
                x = block[:, :FEATURES]
                x[:] = rng.standard_normal((batch_size, FEATURES), dtype=np.float32)
                block[:, FEATURES] = x @ TRUE_W + 0.01 * rng.standard_normal(batch_size, dtype=np.float32)
                del block, x
                loan.publish()


class Trainer:
    """Fits the model on batches in index order; a batch that comes early waits its turn."""

    def __init__(self, batch_size, lr=0.05):
        self.batch_size, self.lr = batch_size, lr
        self.w = np.zeros(FEATURES, dtype=np.float32)
        self.next = 0  # the index of the batch to train on next
        self.early = {}  # index -> its message, held (not copied) until its turn
        self.most_held = 0

    def take(self, index, msg):
        self.early[index] = msg
        self.most_held = max(self.most_held, len(self.early))
        while self.next in self.early:
            self.step(self.early.pop(self.next))
            self.next += 1

    def step(self, msg):
        block = np.frombuffer(msg, dtype=np.float32, offset=HEADER).reshape(self.batch_size, FEATURES + 1)
        assert block.ctypes.data == msg.address + HEADER  # the batch was not copied
        x, y = block[:, :FEATURES], block[:, FEATURES]
        err = x @ self.w - y
        self.w -= self.lr * (x.T @ err) / self.batch_size
        if self.next % 50 == 0:
            print(f"batch {self.next:4d}  loss {float(np.mean(err ** 2)):.5f}")
        del block, x, y
        msg.release()  # its memory goes back to the loader that wrote it


def train(channel_name, loaders, batch_size):
    ctx = lf.Context(gpu="disabled")
    trainer = Trainer(batch_size)
    # Waits for the first loader; the others attach as they start.
    with lf.consumer(ctx, channel_name, kind="fan_in", max_peers=loaders, rendezvous_timeout=60) as ch:
        serving = {}  # slot -> [its loader's id (learnt from its first batch), the last index it sent]
        ended = []  # (slot, loader id, last index) of each loader whose end was reported
        while len(ended) < loaders:
            try:
                msg = ch.recv(timeout=60)
            except lf.PeerGoneError as gone:
                # One loader's end, after its last batch; the others go on, and a loader that
                # starts late may take the slot it freed.
                ended.append((gone.producer, *serving.pop(gone.producer, (None, None))))
                continue
            index = int(np.frombuffer(msg, dtype=np.uint64, count=1)[0])
            mine = serving.setdefault(msg.producer, [index % loaders, -1])
            # Each loader's batches come in its order: loader k sends k, k + N, k + 2N, ...
            assert index % loaders == mine[0] and index > mine[1], f"batch {index} out of order"
            mine[1] = index
            trainer.take(index, msg)
    for slot, loader_id, last in sorted(ended, key=lambda e: (e[1] is None, e[1] or 0)):
        print(f"loader {loader_id} sent through slot {slot}, up to batch {last}"
              if loader_id is not None else f"a loader of slot {slot} ended without a batch")
    return trainer


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loaders", type=int, default=4, help="loader processes (1 to 64)")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    name = "example-loader-" + uuid.uuid4().hex[:8]
    spawn = mp.get_context("spawn")
    procs = [spawn.Process(target=loader, args=(name, i, args.loaders, args.batches, args.batch_size))
             for i in range(args.loaders)]
    for p in procs:
        p.start()
    try:
        trainer = train(name, args.loaders, args.batch_size)
    finally:
        for p in procs:
            p.join(timeout=60)
    failed = [i for i, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        raise SystemExit(f"loaders {failed} failed (exit codes {[procs[i].exitcode for i in failed]})")
    if trainer.early:
        raise SystemExit(f"batch {trainer.next} never came: batches {sorted(trainer.early)} were left waiting")
    error = float(np.max(np.abs(trainer.w - TRUE_W)))
    print(f"trained on {trainer.next} batches from {args.loaders} loaders, in order "
          f"(at most {trainer.most_held} held for their turn); largest weight error {error:.4f}")
    if trainer.next != args.batches or error > 0.05:
        raise SystemExit("training did not converge")


if __name__ == "__main__":
    main()
