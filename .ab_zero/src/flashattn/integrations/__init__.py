"""Integrations with other libraries. Each submodule imports its library lazily.

- :mod:`flashattn.integrations.transformers`: ``register()`` makes
  ``attn_implementation="flashattn"`` available to Hugging Face transformers models.
"""
