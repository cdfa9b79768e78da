# SPDX-License-Identifier: Apache-2.0
"""Resynthesis on the prefill cache: a frozen backbone (parent) loaded from the warm ttnn weight
cache computes prompt prefill features once, the durable prefill cache keeps them, and training
of a child reads them back.

``parent``    the frozen backbone and its identity (from the weight cache's marker)
``features``  the position policy, the authority of one prompt, the packet of one prefill
``waves``     the producer: one prefill per prompt across processes (claims), stores that fail
              degrade to memory, a size cap; and waves behind a durable cursor
``source``    what a training loop asks: in-memory LRU -> durable sidecar -> the parent
``threads``   torch threads that share the CPUs with the other processes computing at once
``cli``       ``tt-cache prefill ls|verify|gc`` (torch-free)

Nothing is imported here, so ``cli`` starts without torch or ttnn.
"""
