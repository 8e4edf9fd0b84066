"""A data loader process feeding numpy batches to a trainer process through a lava-flow channel.

    python examples-python/data_loader.py [--batches N] [--batch-size B]

The loader (a separate process, started with multiprocessing's spawn) writes each batch of
features and labels straight into the channel's shared memory (a loan: no copy), the trainer
reads it there (numpy.frombuffer over the message: no copy) and fits a linear model with SGD.
The trainer prints the loss as it falls and the weights it found, which the loader drew from.
"""
import argparse
import multiprocessing as mp
import os
import uuid

import numpy as np

import lava_flow as lf

FEATURES = 16
TRUE_W = np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32)


def batch_bytes(batch_size):
    return batch_size * (FEATURES + 1) * 4


def loader(channel_name, batches, batch_size):
    rng = np.random.default_rng(0)
    ctx = lf.Context(gpu="disabled")
    with lf.producer(ctx, channel_name, capacity=8) as ch:
        for _ in range(batches):
            with ch.loan(batch_bytes(batch_size)) as loan:
                # Features and labels laid out in the loaned shared memory itself.
                block = np.frombuffer(loan, dtype=np.float32).reshape(batch_size, FEATURES + 1)
                x = block[:, :FEATURES]
                x[:] = rng.standard_normal((batch_size, FEATURES), dtype=np.float32)
                block[:, FEATURES] = x @ TRUE_W + 0.01 * rng.standard_normal(batch_size, dtype=np.float32)
                del block, x
                loan.publish()


def trainer(channel_name, batch_size, lr=0.05):
    ctx = lf.Context(gpu="disabled")
    ch = lf.consumer(ctx, channel_name)
    w = np.zeros(FEATURES, dtype=np.float32)
    step = 0
    for msg in ch:  # until the loader has gone
        block = np.frombuffer(msg, dtype=np.float32).reshape(batch_size, FEATURES + 1)
        assert block.ctypes.data == msg.address  # the batch was not copied
        x, y = block[:, :FEATURES], block[:, FEATURES]
        err = x @ w - y
        w -= lr * (x.T @ err) / batch_size
        if step % 50 == 0:
            print(f"step {step:4d}  loss {float(np.mean(err ** 2)):.5f}")
        step += 1
        del block, x, y
        msg.release()
    return step, w


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    name = "example-loader-" + uuid.uuid4().hex[:8]
    proc = mp.get_context("spawn").Process(target=loader, args=(name, args.batches, args.batch_size))
    proc.start()
    steps, w = trainer(name, args.batch_size)
    proc.join()
    if proc.exitcode != 0:
        raise SystemExit(f"the loader failed with exit code {proc.exitcode}")
    error = float(np.max(np.abs(w - TRUE_W)))
    print(f"trained on {steps} batches; largest weight error {error:.4f}")
    if steps != args.batches or error > 0.05:
        raise SystemExit("training did not converge")


if __name__ == "__main__":
    main()
