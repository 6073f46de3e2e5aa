"""Models: the decoder-only transformer and everything that is a function of its params.

Owns ``transformer`` (Qwen3 / Qwen2 / Llama in Flax NNX, forward, KV-cache forward, router
capture of MoE layers), ``moe`` (the sparse block as arguments-in functions), ``sharding``
(the mesh's named axes and the logical-axis rules), ``logprobs`` (token log-probs without
a [B, T, V] logits array), ``flops`` (FLOPs per token and matmul rates) and ``hf``
(Hugging Face checkpoints in and out). Imports only the top-level shared modules.
"""
