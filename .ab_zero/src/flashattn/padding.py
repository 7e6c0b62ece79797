"""``flashattn.padding``: flash-attn's ``bert_padding`` helpers (``unpad_input``, ``pad_input``,
``index_first_axis``, ``index_put_first_axis``, ``unpad_input_for_concatenated_sequences``).
The public path; the code lives in :mod:`flashattn.api.bert_padding`."""
from flashattn.api.bert_padding import *  # noqa: F401,F403
from flashattn.api.bert_padding import __all__  # noqa: F401
