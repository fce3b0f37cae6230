"""Build the tiny random-weight Llama that the live engines serve: `python tiny_models.py OUT_DIR`.

Runs inside the tools venv of the engine cache (tests/live/engines.py makes it), never in the project venv:
it needs only `tokenizers`, `gguf` and `numpy`, and it must not import the exporter. Nothing is downloaded:
the tokenizer is trained here on the text below, and the weights are seeded random numbers.

Writes OUT_DIR/hf/ (config.json, tokenizer files, generation_config.json; vLLM serves it with
`--load-format dummy`, so no weight file is needed) and OUT_DIR/tiny-llama-f32.gguf (the same shapes and the
same tokenizer, for llama.cpp).
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import NamedTuple

# The shapes the issue measured with. head_dim * heads = hidden, and 2 KV heads make it grouped-query, so
# the exporter's KV-bytes-per-token arithmetic (2 * layers * kv_heads * head_dim * dtype bytes) is exercised.
LAYERS = 2
HIDDEN = 256
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
INTERMEDIATE = 512
VOCAB = 1000
MAX_POSITIONS = 2048
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
SEED = 16

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIALS = [BOS, EOS, PAD]  # ids 0, 1, 2: the trainer puts special tokens first, in this order

# A minimal chat template, so /v1/chat/completions works on both engines. Jinja, read by transformers (vLLM)
# and by llama.cpp's own template engine.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

# Enough distinct words that byte-level BPE reaches the full 1000-token vocabulary without padding tokens.
TEXT = """
A large language model server receives requests from many clients at once. Each request carries a prompt,
which the engine splits into tokens, and the scheduler decides which requests run in the next step. During
prefill the engine computes attention keys and values for every prompt token and stores them in the paged
key value cache; during decode it produces one new token per running sequence per step. When the cache is
full, the scheduler preempts a sequence, frees its blocks, and later recomputes or swaps them back. Prefix
caching lets two requests that share the same system prompt reuse blocks that were already computed, which
shortens the time to first token and saves compute. Metrics exported by the engine describe all of this:
counters of prompt and generation tokens, histograms of time to first token, inter token latency, end to end
request latency, queue time, prefill time and decode time, gauges of running and waiting requests, and the
fraction of the cache in use. An exporter scrapes those pages, normalizes names and units across engines,
joins them with graphics processor telemetry such as utilization, memory bandwidth, power, temperature and
clock frequency, and derives what limits throughput: compute, memory bandwidth, cache capacity, scheduler
limits, the host processor, or nothing at all when the server is simply idle. Operators read dashboards,
receive alerts when latency objectives are violated, and decide whether to add replicas, raise batch limits,
quantize weights, shorten contexts, or move traffic elsewhere. Quick brown foxes jump over lazy dogs; zebras
quietly vex wizards; the jovial sphinx judges quirky black vows. Numbers matter too: 0 1 2 3 4 5 6 7 8 9 10
16 32 64 128 256 512 1024 2048 4096 percent, seconds, milliseconds, bytes, kilobytes, megabytes, gigabytes.
Streaming responses deliver tokens as server sent events, while non streaming responses wait for the whole
completion. Clients sometimes abort, disconnect, retry with backoff, or send bursts that exceed capacity.
Speculative decoding drafts several tokens with a small model and verifies them with the large one; its
acceptance rate decides whether it helps. Tensor parallelism splits layers across devices, pipeline
parallelism splits stages, and data parallelism adds independent replicas behind a load balancer.
"""


def train_tokenizer():  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=1,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the text changes no merge, but keeps frequencies above ties for a stable merge order.
    tok.train_from_iterator([TEXT] * 4, trainer=trainer)
    # Byte-level BPE on a short text may stop short of VOCAB: pad with reserved tokens so that the GGUF token
    # list and the embedding matrix agree exactly (llama.cpp refuses a mismatch).
    missing = VOCAB - tok.get_vocab_size()
    if missing > 0:
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    if tok.get_vocab_size() != VOCAB:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, want {VOCAB}")
    for i, name in enumerate(SPECIALS):
        if tok.token_to_id(name) != i:
            raise SystemExit(f"special token {name} has id {tok.token_to_id(name)}, want {i}")
    return tok


def write_hf(tok, out: pathlib.Path, shape: Shape | None = None) -> None:
    shape = shape or TINY
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        # Like most published checkpoints, the file says bfloat16 while the engine is started with
        # `--dtype float32`: the exporter must read the served dtype, not this field (issue 16).
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}, indent=2) + "\n"
    )
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "pad_token": PAD,
                "model_max_length": MAX_POSITIONS,
                "add_bos_token": True,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, indent=2) + "\n"
    )


def _merges(tok) -> list[str]:
    model = json.loads(tok.to_str())["model"]
    # tokenizers writes merges as ["a", "b"] pairs (0.20+) or "a b" strings (older): GGUF wants strings.
    return [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]


class Shape(NamedTuple):
    """A Llama's shapes, as both the HF config and the GGUF declare them."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


TINY = Shape(LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE)
# The planner's validation model (issue 31): about 134 M parameters, 270 MB in F16, so a decode step streams
# far more than the CPU's caches hold (32 MiB L3 here) and llama.cpp is memory-bound at small batches, as a
# GPU engine is. The same seeded weights are written as F16, Q8_0 and Q4_0.
PLAN = Shape(layers=12, hidden=1024, heads=16, kv_heads=4, head_dim=64, intermediate=2816)
PLAN_TYPES = ("f16", "q8_0", "q4_0")


def plan_gguf_name(wtype: str) -> str:
    return f"plan-llama-{wtype}.gguf"


def write_gguf(tok, path: pathlib.Path, shape: Shape = TINY, wtype: str = "f32", name: str = "tiny-llama") -> None:
    import gguf
    import numpy as np

    qtypes = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
              "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
    file_types = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                  "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}
    qtype = qtypes[wtype]
    counter = iter(range(1 << 20))
    # The tiny model keeps its one sequential generator, so its weights (and the text the captured pages
    # came from) are those of recipe 2.
    shared = np.random.default_rng(SEED) if shape == TINY else None

    def weight(rows: int, cols: int) -> tuple[np.ndarray, object]:
        # One generator per tensor, seeded by its position: every weight type gets the same numbers.
        # numpy (out, in); GGUFWriter reverses the dims, giving llama.cpp's ne0 = in.
        if shared is not None:
            data = (shared.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        else:
            rng = np.random.default_rng([SEED, next(counter)])
            data = rng.standard_normal((rows, cols), dtype=np.float32) * 0.02
        if wtype == "f32":
            return data, None
        if wtype == "f16":
            return data.astype(np.float16), None
        return gguf.quants.quantize(data, qtype), qtype

    def add(w, tensor_name: str, rows: int, cols: int) -> None:
        data, raw = weight(rows, cols)
        w.add_tensor(tensor_name, data, raw_dtype=raw)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    vocab = tok.get_vocab()
    tokens = [""] * VOCAB
    for text, i in vocab.items():
        tokens[i] = text
    special_ids = {tok.token_to_id(t) for t in SPECIALS} | {
        i for text, i in vocab.items() if text.startswith("<|reserved_")
    }
    types = [gguf.TokenType.CONTROL if i in special_ids else gguf.TokenType.NORMAL for i in range(VOCAB)]

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_file_type(file_types[wtype])
    w.add_context_length(MAX_POSITIONS)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.intermediate)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(VOCAB)
    # Model "gpt2" is llama.cpp's byte-level BPE (the same byte-to-unicode token spelling as `tokenizers`);
    # pre-tokenizer "gpt-2" (with the dash: "gpt2" is refused) is the GPT-2 split regex that ByteLevel uses.
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(_merges(tok))
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_pad_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    h, q, kv, ff = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    add(w, "token_embd.weight", VOCAB, h)
    for b in range(shape.layers):
        w.add_tensor(f"blk.{b}.attn_norm.weight", ones(h))
        add(w, f"blk.{b}.attn_q.weight", q, h)
        add(w, f"blk.{b}.attn_k.weight", kv, h)
        add(w, f"blk.{b}.attn_v.weight", kv, h)
        add(w, f"blk.{b}.attn_output.weight", h, q)
        w.add_tensor(f"blk.{b}.ffn_norm.weight", ones(h))
        add(w, f"blk.{b}.ffn_gate.weight", ff, h)
        add(w, f"blk.{b}.ffn_up.weight", ff, h)
        add(w, f"blk.{b}.ffn_down.weight", h, ff)
    w.add_tensor("output_norm.weight", ones(h))
    add(w, "output.weight", VOCAB, h)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = pathlib.Path(argv[0])
    tok = train_tokenizer()
    write_hf(tok, out / "hf")
    write_gguf(tok, out / "tiny-llama-f32.gguf")
    write_hf(tok, out / "plan-hf", PLAN)
    for wtype in PLAN_TYPES:
        write_gguf(tok, out / plan_gguf_name(wtype), PLAN, wtype, name="plan-llama")
    print(json.dumps({"vocab": tok.get_vocab_size(), "merges": len(_merges(tok)), "out": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
