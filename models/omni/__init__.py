"""The Qwen2.5-Omni family: causal thinker features in three streaming modes, and pruned multiple-choice QA.

Public surface (everything else is an implementation detail of this package):

- :class:`OmniThinkerRunner` — one session through the thinker on a streaming schedule (``run_stream``), with its
  masks, verification and cost accounting; :class:`StreamResult`, :class:`Payload` are what it returns and commits;
- :class:`BatchedOmniRunner` — several sessions in lockstep (``run_streams``), states equal to the one-session
  runner; :data:`COMPUTED_FIELDS`, :data:`BREAKDOWN_PARTS`, :func:`single_session_computed` describe its accounting;
- :class:`OmniQA` — training-free token pruning and prefill-FLOPs accounting for omni QA (:data:`FULL` is the
  no-pruning variant, :func:`prefill_flop_fields` the records' FLOPs fields);
- the tiny model (:mod:`.tiny`) is imported from its module.
"""
from .batch import BREAKDOWN_PARTS, COMPUTED_FIELDS, BatchedOmniRunner, single_session_computed
from .qa import FULL, OmniQA
from .qa_inputs import prefill_flop_fields
from .thinker import OmniThinkerRunner
from .thinker_media import Payload
from .thinker_stream import StreamResult

__all__ = ["BREAKDOWN_PARTS", "COMPUTED_FIELDS", "FULL", "BatchedOmniRunner", "OmniQA", "OmniThinkerRunner",
           "Payload", "StreamResult", "prefill_flop_fields", "single_session_computed"]
