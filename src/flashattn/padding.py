"""``flashattn.padding``: flash-attn's ``bert_padding`` helpers (``unpad_input``, ``pad_input``,
``index_first_axis``, ``index_put_first_axis``, ``unpad_input_for_concatenated_sequences``).
The public path; the code lives in :mod:`flashattn.api.padding`."""
from flashattn.api.padding import *  # noqa: F401,F403
from flashattn.api.padding import __all__  # noqa: F401
