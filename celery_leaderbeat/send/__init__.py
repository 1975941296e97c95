"""The send path: from a chunk of granted slots to messages in the broker.

One interface (:class:`.base.ChunkSend`), one reference implementation (the
plain path, :mod:`.plain`) and the optimisations behind the same interface,
each checked at start-up and falling back to the plain path, said once:
claim and enqueue in one step on the state's own Redis (:mod:`.one_step`),
a chunk in one socket write on py-amqp (:mod:`.single_write`), messages built
from kept shapes (:mod:`.templates`). :mod:`.sender` chooses among them.
"""
