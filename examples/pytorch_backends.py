#!/usr/bin/env python3
"""A small randomly initialised transformer (Llama-style, GQA) run with each attention backend:
transformers' "sdpa", flashcore through transformers ("fcore"), and flashcore as PyTorch's SDPA
flash implementation; prints the time per forward pass and how far the logits are from "sdpa".

    pip install ./python transformers      # on a machine with an H100/H200
    python3 examples/pytorch_backends.py [--seqlen 2048] [--dtype bf16]
"""

import argparse
import copy
import time

import torch
import transformers

import flashcore
import flashcore.hf


def timed(model, ids, reps):
    with torch.inference_mode():
        for _ in range(3):
            logits = model(ids).logits
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            logits = model(ids).logits
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3, logits.float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="bf16")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                                   num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=a.seqlen)
    torch.manual_seed(0)
    name = flashcore.hf.register()
    with torch.device("cuda"):  # initialise on the GPU: much faster than on the CPU
        ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="sdpa")
        fc = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=name)
    ref, fc = ref.to(dtype).eval(), fc.to(dtype).eval()
    fc.load_state_dict(ref.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seqlen), device="cuda")

    print("%s, batch %d, %d tokens, %s, head dim %d" % (torch.cuda.get_device_name(), a.batch, a.seqlen, a.dtype,
                                                      cfg.hidden_size // cfg.num_attention_heads))
    ms, want = timed(ref, ids, a.reps)
    print("  %-28s %8.2f ms/forward" % ('transformers "sdpa"', ms))
    ms, got = timed(fc, ids, a.reps)
    err = ((got - want).norm() / want.norm()).item()
    print("  %-28s %8.2f ms/forward   logits rel. L2 vs sdpa %.1e" % ('transformers "%s"' % name, ms, err))
    if flashcore.sdpa_backend.available():
        # PyTorch picks an SDPA backend per call (on an H100 often cuDNN); only calls that go to its
        # flash backend reach a flash implementation, so both rows below ask for flash alone.
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ms, got = timed(ref, ids, a.reps)
        err = ((got - want).norm() / want.norm()).item()
        print("  %-28s %8.2f ms/forward   logits rel. L2 vs sdpa %.1e" % ("SDPA flash backend (FA2)", ms, err))
        served = flashcore.sdpa_backend.stats["flashcore"]
        torch.nn.attention.activate_flash_attention_impl("flashcore")
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ms, got = timed(ref, ids, a.reps)
        finally:
            torch.nn.attention.restore_flash_attention_impl()
        served = flashcore.sdpa_backend.stats["flashcore"] - served
        err = ((got - want).norm() / want.norm()).item()
        print("  %-28s %8.2f ms/forward   logits rel. L2 vs sdpa %.1e   (%d attention calls on flashcore)"
              % ("SDPA flash impl = flashcore", ms, err, served))

if __name__ == "__main__":
    main()
