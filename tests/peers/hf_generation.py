"""transformers' own logits processors for a set of generation keys, as its `generate` builds them: the config
over `GenerationConfig`'s defaults, the special tokens and lengths prepared (`_prepare_special_tokens`,
`_prepare_generated_length`), then `GenerationMixin._get_logits_processor`; so a release that changes a
processor, the order or a default is noticed by the tests that compare with it."""

from __future__ import annotations

import functools
import warnings

import torch
import transformers
from transformers import GenerationConfig


@functools.cache
def tiny_model(encoder_decoder: bool = False):
    """A one-layer random model whose GenerationMixin builds the processors (its weights are never run)."""
    if encoder_decoder:
        cfg = transformers.T5Config(vocab_size=64, d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2)
        return transformers.T5ForConditionalGeneration(cfg).eval()
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def hf_processors(
    keys: dict,
    *,
    input_len: int,
    max_new_tokens: int,
    eos=None,
    mask: torch.Tensor | None = None,
    encoder_ids: torch.Tensor | None = None,
    encoder_decoder: bool = False,
):
    """transformers' LogitsProcessorList for `keys` (a generation_config's), a prompt of `input_len` columns (an
    encoder-decoder's decoder start: 1), its attention mask (a decoder's left padding) and encoder ids (a
    decoder's: its prompt)."""
    model = tiny_model(encoder_decoder)
    defaults = GenerationConfig._get_default_generation_params()
    start = {"decoder_start_token_id": 0} if encoder_decoder else {}
    config = GenerationConfig(**{**defaults, **start, **keys, "eos_token_id": eos, "max_new_tokens": max_new_tokens})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model._prepare_special_tokens(config, mask is not None, device="cpu")
        ids = torch.zeros((1, input_len), dtype=torch.long)
        config = model._prepare_generated_length(
            config,
            has_default_max_length=False,
            has_default_min_length="min_length" not in keys,
            model_input_name="input_ids",
            input_ids_length=input_len,
            inputs_tensor=ids,
        )
        kwargs = {} if mask is None else {("decoder_attention_mask" if encoder_decoder else "attention_mask"): mask}
        return model._get_logits_processor(
            config,
            input_ids_seq_length=input_len,
            encoder_input_ids=encoder_ids,
            device="cpu",
            model_kwargs=kwargs,
        )
