"""Rollout: from prompts to scored responses with the policy's own params.

Owns ``sampler`` (jitted prefill + ``lax.while_loop`` decode over a preallocated KV
cache), ``groups`` (G responses per prompt, rewards, validation mean@k), ``filtering``
(dynamic sampling), ``sources`` (synchronous, asynchronous or partial rollouts as a
stream of batches) and ``partial`` (responses continued across updates). Imports
``models``, ``tasks`` and the top-level shared modules.
"""
