"""PyTorch tensors in lava-flow memory, sent by reference to another process.

    python examples-python/torch_pool.py

Tensors made under `torch.cuda.use_mem_pool(pool)`, with `pool = lf.torch.mem_pool(...)`, lie
in lava-flow GPU buffers: Vulkan memory that Vulkan, OpenCL, OpenGL and CUDA consumers can all
open. `send_tensor` sends one as its buffer; the consumer, another process, gets an ordinary GPU
message whose `torch.from_dlpack` is a tensor over the producer's very bytes. Needs PyTorch 2.8
or newer with CUDA, on a GPU that lava-flow opens with Vulkan.
"""
import multiprocessing as mp
import uuid

import torch

import lava_flow as lf


def consumer(name):
    ctx = lf.Context(gpu="required", gpu_device=lf.torch.device_uuid(0))
    with lf.consumer(ctx, name, rendezvous_timeout=60) as ch:
        for msg in ch:  # until the producer has gone
            x = torch.from_dlpack(msg).view(torch.float32)  # the producer's bytes, no copy
            print(f"batch {msg.sequence}: GPU message {msg.is_gpu}, sum {x.sum().item():.0f}")
            x *= 2  # in place: the producer sees it once the message is released
            del x
            msg.release()


def main():
    name = "torch-pool-" + uuid.uuid4().hex[:8]
    peer = mp.get_context("spawn").Process(target=consumer, args=(name,))
    peer.start()
    ctx = lf.Context(gpu="required", gpu_device=lf.torch.device_uuid(0))
    pool = lf.torch.mem_pool(0, context=ctx)  # send on channels of the same Context
    with torch.cuda.use_mem_pool(pool):
        batches = [torch.full((1 << 20,), float(i), device="cuda:0") for i in range(3)]
    buffer, offset = lf.torch.buffer_of(batches[0])
    print(f"batch 0 is {batches[0].nbytes} bytes at offset {offset} of {buffer!r}")
    with lf.producer(ctx, name, rendezvous_timeout=60) as ch:  # the consumer starts torch first
        for batch in batches:
            # By reference; the channel keeps the tensor until the consumer released it.
            ch.wait_completed(ch.send_tensor(batch), timeout=60)
    peer.join()
    print("after the consumer:", [batch[0].item() for batch in batches])


if __name__ == "__main__":
    main()
