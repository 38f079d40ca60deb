"""llama.cpp's model for the generation benchmark: a transformers LLaMA checkpoint written as a GGUF
(gguf-py), F32, then quantized by llama_cpp.llama_model_quantize (Q8_0 for int8, Q4_0 for int4).

Runs in llama-cpp-python's environment, loaded by bench/generate_peers.py from beside it: like that
file it imports only the standard library at the top (numpy, safetensors, gguf and llama_cpp inside
the functions), and of attnzoo's only the error root, where it is importable (GGUFError is then a
zoo.AttnzooError; in llama-cpp-python's environment a plain ValueError).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

try:  # attnzoo's error root where attnzoo is importable (the bench's own process, the tests)
    from zoo.errors import AttnzooError

    _ROOTS: tuple[type, ...] = (AttnzooError, ValueError)
except ImportError:  # llama-cpp-python's environment: there the worker turns any exception into the row's error
    _ROOTS = (ValueError,)  # not (Exception, ValueError): a base before its own subclass has no consistent MRO


class GGUFError(*_ROOTS):
    """A checkpoint this writer cannot turn into llama.cpp's LLAMA model (an odd head_dim, a tensor with no
    llama.cpp name, a config llama.cpp reads differently); the message names the value."""


LLAMA_QUANT = {"int8": "Q8_0", "int4": "Q4_0"}  # llama_model_quantize from the F32 file, its default rules


def rope_interleave_order(heads: int, head_dim: int):
    """The row order that turns HF LLaMA's rotate-half rotary into llama.cpp's interleaved-pair one.

    HF rotates row i with row i + head_dim/2 of each head at frequency i; llama.cpp's LLAMA arch
    (rope type NORM) rotates rows 2j and 2j+1 at frequency j. So new row 2j is old row j and new row
    2j+1 is old row j + head_dim/2, head by head: `w[order]` for q_proj (heads) and k_proj (kv heads).
    q.k per head is unchanged by one permutation applied to both, so attention is the same."""
    import numpy as np

    if head_dim % 2:
        raise GGUFError(f"head_dim {head_dim} is odd: rotary needs pairs")
    half = head_dim // 2
    within = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)  # 0, h, 1, h+1, ...
    return (np.arange(heads)[:, None] * head_dim + within[None, :]).reshape(-1)


def _llama_refusal(config: dict) -> str | None:
    """Why this config is not written as llama.cpp's LLAMA arch exactly, or None."""
    if config.get("model_type") != "llama":
        return f"model_type {config.get('model_type')!r}: only 'llama' is written as a GGUF here"
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    checks = [
        (config.get("hidden_act", "silu") != "silu", f"hidden_act {config.get('hidden_act')!r} is not silu"),
        (kind != "default", f"rope scaling {kind!r} is not written (default rotary only)"),
        (config.get("attention_bias") or config.get("mlp_bias"), "attention or MLP biases are not written"),
        (config.get("partial_rotary_factor", 1.0) != 1.0, "partial rotary is not written"),
    ]
    return next((why for bad, why in checks if bad), None)


def _hf_tensors(folder: str):
    """(name, float32 array) for every tensor of the folder's safetensors, sharded or not."""
    import numpy as np
    from safetensors import safe_open

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        path = os.path.join(folder, name)
        with safe_open(path, framework="numpy") as f:
            for key in f.keys():
                if f.get_slice(key).get_dtype() == "BF16":  # numpy has no bfloat16: widen its bits
                    yield key, _bf16_tensor(path, key)
                else:
                    yield key, np.ascontiguousarray(f.get_tensor(key), dtype=np.float32)


def _bf16_tensor(path: str, key: str):
    """A BF16 tensor of a safetensors file as float32: its 16 bits are float32's upper half."""
    import numpy as np

    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")  # the format: u64 header size, JSON header, data
        entry = json.loads(f.read(size))[key]
        start, end = entry["data_offsets"]
        f.seek(8 + size + start)
        bits = np.frombuffer(f.read(end - start), dtype="<u2")
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def _gguf_name(hf: str) -> str | None:
    """llama.cpp's name for a transformers LLaMA tensor; None for one it has no use for."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    top["lm_head.weight"] = "output.weight"
    if hf in top:
        return top[hf]
    parts = hf.split(".")  # model.layers.N.<module>.<proj>.weight
    if len(parts) < 5 or parts[:2] != ["model", "layers"]:
        raise GGUFError(f"tensor {hf} has no llama.cpp name here")
    block = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    module = ".".join(parts[3:-1])
    if module == "self_attn.rotary_emb":
        return None  # old checkpoints' inv_freq buffer: llama.cpp computes its own
    if module not in block or parts[-1] != "weight":
        raise GGUFError(f"tensor {hf} has no llama.cpp name here")
    return f"blk.{parts[2]}.{block[module]}.weight"


def write_llama_gguf(folder: str, out: str) -> dict:
    """The checkpoint as an F32 GGUF of arch "llama", with a synthetic vocabulary of vocab_size tokens."""
    import gguf

    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    why = _llama_refusal(config)
    if why:
        raise GGUFError(why)
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    vocab = config["vocab_size"]
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    # The loop feeds ids, never text: tokens <tN>, with the config's specials as control tokens.
    eos = config.get("eos_token_id")
    specials = {config.get("bos_token_id"): "<s>", config.get("pad_token_id"): "<pad>"}
    specials.update({i: "</s>" for i in (eos if isinstance(eos, list) else [eos])})
    specials = {i: text for i, text in specials.items() if isinstance(i, int) and 0 <= i < vocab}
    writer.add_tokenizer_model("llama")
    writer.add_token_list([specials.get(i, f"<t{i}>") for i in range(vocab)])
    writer.add_token_scores([0.0] * vocab)
    normal, control = int(gguf.TokenType.NORMAL), int(gguf.TokenType.CONTROL)
    writer.add_token_types([control if i in specials else normal for i in range(vocab)])
    for key, value in (("bos", config.get("bos_token_id")), ("eos", eos), ("pad", config.get("pad_token_id"))):
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int) and 0 <= value < vocab:
            getattr(writer, f"add_{key}_token_id")(value)
    writer.add_add_bos_token(False)
    orders = {"attn_q": rope_interleave_order(heads, head_dim), "attn_k": rope_interleave_order(kv_heads, head_dim)}
    tied = config.get("tie_word_embeddings", False)
    count = 0
    for hf, array in _hf_tensors(folder):
        name = _gguf_name(hf)
        if name is None or (tied and name == "output.weight"):
            continue
        kind = name.split(".")[-2]
        writer.add_tensor(name, array[orders[kind]] if kind in orders else array)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"tensors": count, "gguf": _version("gguf")}


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:  # imported from a source tree on the path (llama.cpp's gguf-py): no metadata
        module = __import__(package)
        return f"source at {Path(module.__file__).parent}"


def _gguf_tensor_types(path: str) -> dict[str, int]:
    import gguf

    counts: dict[str, int] = {}
    for tensor in gguf.GGUFReader(path).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return counts


def build_llama(job: dict) -> dict:
    """job["model"]: an F32 GGUF for fp32; for int8/int4 the F32 file, then llama_model_quantize to Q8_0/Q4_0."""
    with open(os.path.join(job["checkpoint"], "config.json")) as f:
        why = _llama_refusal(json.load(f))
    if why:  # refused before llama_cpp is imported
        return {"ok": False, "error": why}
    import ctypes

    import llama_cpp

    os.makedirs(os.path.dirname(os.path.abspath(job["model"])), exist_ok=True)
    quant = LLAMA_QUANT.get(job["precision"])
    f32 = job["model"] + ".f32.gguf" if quant else job["model"]
    info = write_llama_gguf(job["checkpoint"], f32)
    info["note"] = "GGUF F32 written by bench/gguf_llama.py (gguf-py)"
    if quant:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant}")
        params.nthread = job["threads"]
        code = llama_cpp.llama_model_quantize(f32.encode(), job["model"].encode(), ctypes.byref(params))
        os.remove(f32)
        if code != 0:
            return {"ok": False, "error": f"llama_model_quantize to {quant} returned {code}"}
        info["note"] = f"{quant} by llama_cpp.llama_model_quantize (its default rules) from that F32 GGUF"
    info["tensor_types"] = _gguf_tensor_types(job["model"])
    info["llama_cpp_python"] = llama_cpp.__version__
    return info
