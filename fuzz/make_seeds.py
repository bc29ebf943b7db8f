"""Writes the seed corpora under fuzz/corpus/ from real inputs (run once; the fuzzer then
grows and `fuzz.sh cmin` minimizes them). Needs the `gguf` package and the default model.

- gguf: the default model's metadata with its vocabulary cut to 300 tokens (and the merges
  among them) and its tensors shrunk to 32 elements each, plus a few truncated headers;
- state: hand-built session files for the default model (mode byte 0: the target adds the
  fingerprint and checksum), with and without a saved KV cache;
- tokenizer: llama.cpp's tokenizer test texts, with and without special tokens, and ids;
- chat: llama.cpp's reference chat templates (a handful) and SmolLM2's, with messages;
- sampler: a few byte strings;
- grammar: JSON Schemas, regular expressions, Lark grammars and choices (mode byte, text, NUL,
  token picks), each with and without the two-part check;
- request: server request bodies (endpoint byte, then the JSON body): the documented shapes of
  every endpoint, llama-server's fields, tool calls, grammars and a few bad bodies.

`python fuzz/make_seeds.py grammar request` writes only the named targets' seeds.
"""
import hashlib, json, os, struct, sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).parent / "corpus"
MODEL = Path(os.environ.get("REPROLM_MODEL", Path.home() / ".cache/reprolm/SmolLM2-135M-Instruct.Q4_1.gguf"))
REF = Path(os.environ.get("REPROLM_REFERENCE", "/work/shared/reference/llamacpp-vocab"))


def put(target, data):
    d = ROOT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


def field_value(f):
    t = f.types[0]
    if t == gguf.GGUFValueType.STRING:
        return str(bytes(f.parts[-1]), "utf-8"), t, None
    if t == gguf.GGUFValueType.ARRAY:
        sub = f.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [str(bytes(f.parts[i]), "utf-8") for i in f.data], t, sub
        return [f.parts[i].tolist()[0] for i in f.data], t, sub
    return f.parts[-1].tolist()[0], t, None


def mini_gguf(n_vocab=300, alignment=None):
    r = gguf.GGUFReader(MODEL)
    w = gguf.GGUFWriter(path=None, arch="llama")
    tokens = None
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value, t, sub = field_value(f)
        if name == "tokenizer.ggml.tokens":
            value = value[:n_vocab]
            tokens = set(value)
        elif name == "tokenizer.ggml.token_type":
            value = value[:n_vocab]
        elif name == "tokenizer.ggml.merges":
            value = [m for m in value if all(p in tokens for p in m.split(" ", 1)) and m.replace(" ", "") in tokens][:200]
        elif name == "tokenizer.chat_template":
            value = value  # kept whole: the chat target gets it too
        elif name.endswith(("bos_token_id", "eos_token_id", "padding_token_id", "unknown_token_id")):
            value = min(value, n_vocab - 1)
        elif name == "llama.vocab_size":
            value = n_vocab
        if t == gguf.GGUFValueType.ARRAY and not value:
            continue
        if t == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value, t, sub_type=sub)
        else:
            w.add_key_value(name, value, t)
    if alignment:
        w.add_uint32("general.alignment", alignment)
    for i, tensor in enumerate(r.tensors[:6]):
        w.add_tensor(tensor.name, np.arange(32, dtype=np.float32) * 0.01, raw_dtype=gguf.GGMLQuantizationType.F32)
    out = Path("/tmp/reprolm-seed.gguf")
    w.write_header_to_file(out)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out.read_bytes()


GRAMMARS = [
    (0, '{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}}, "required": ["name"]}'),
    (0, '{"type": "array", "items": {"enum": ["red", "green", 3, null, true]}, "minItems": 1, "maxItems": 3}'),
    (0, '{"anyOf": [{"type": "number", "multipleOf": 0.5}, {"type": "boolean"}, {"const": {"a": [1, 2]}}]}'),
    (0, '{"type": "object", "additionalProperties": {"type": "string", "pattern": "^[a-z]+$"}, "maxProperties": 2}'),
    (0, '{"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}'),
    (0, '{"type": "string", "format": "date-time"}'),
    (0, '{"type": "object", "x-guidance": {"whitespace_flexible": true}, "properties": {"x": {"type": "number"}}}'),
    (0, '{"type": "object"}'),
    (0, 'true'),
    (1, '[0-9]{1,4}(\\.[0-9]+)?'),
    (1, '(yes|no|maybe)!*'),
    (1, '[a-zA-Z_][a-zA-Z0-9_]{0,7} = \\d+;'),
    (1, '\\p{L}+ \\w*'),
    (1, '(?i)hello|world'),
    (2, 'start: sum " = " NUMBER\nsum: NUMBER | sum OP NUMBER\nNUMBER: /[0-9]{1,3}/\nOP: " + " | " - "\n'),
    (2, 'start: item (", " item)*\nitem: NAME ": " NUMBER\nNAME: /[a-z]{1,10}/\nNUMBER: /[0-9]{1,5}/\n'),
    (2, 'start: "<" tag ">" | %json {"type": "integer"}\ntag: /[a-z]+/\n'),
    (2, 'start: a+\na: "x" | "y" b\nb: "z"?\n'),
    (2, '%llguidance {}\nstart: lst\nlst: "[" (NUM ("," NUM)*)? "]"\nNUM: /-?[0-9]+/\n'),
    (3, 'yes\nno\nmaybe'),
    (3, 'The answer is 42\nThe answer is 43\n\u00e9t\u00e9'),
]


def grammar_seeds():
    for kind, text in GRAMMARS:
        for check_parts in (0, 4):
            put("grammar", bytes([kind | check_parts]) + text.encode() + b"\0" + bytes(range(0, 64, 4)))
        put("grammar", bytes([kind]) + text.encode() + b"\0" + b"\xf0\x02\x00")


REQUEST_BODIES = [
    (0, {"model": "reprolm", "prompt": "Once upon a time", "max_tokens": 8}),
    (0, {"model": "reprolm", "prompt": ["a", "b c"], "n": 2, "temperature": 0.7, "top_p": 0.9, "seed": 7,
         "stop": ["\n", "."], "logprobs": 3, "echo": True, "stream": True, "stream_options": {"include_usage": True}}),
    (0, {"model": "reprolm", "prompt": [1, 9690, 28], "logit_bias": {"28": -100, "42": 5.5}, "top_k": 40,
         "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5}),
    (0, {"model": "reprolm", "prompt": [[1, 2], [3]], "n_predict": -1, "repeat_penalty": 1.2, "repeat_last_n": 16,
         "logprobs_mode": "processed", "cache_prompt": True, "best_of": 1}),
    (0, {"model": "reprolm", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "strict": True, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}),
    (0, {"model": "reprolm", "prompt": "x", "response_format": {"type": "json_object"}, "max_tokens": 10 ** 9}),
    (1, {"model": "reprolm", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Hi <|im_end|>"}], "max_tokens": 4}),
    (1, {"model": "reprolm", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}]},
                                          {"role": "user", "content": None, "name": "bob"}],
         "logprobs": True, "top_logprobs": 2, "max_completion_tokens": 3, "n": 3, "seed": -5}),
    (1, {"model": "reprolm", "messages": [{"role": "user", "content": "weather?"}],
         "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"]}}}],
         "tool_choice": "auto", "parallel_tool_calls": False}),
    (1, {"model": "reprolm", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
         "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    (1, {"model": "reprolm", "messages": [{"role": "user", "content": "json"}], "tool_choice": "required",
         "tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}}),
    (2, {"content": "Hello <|im_start|> world", "add_special": True}),
    (2, {"prompt": "Hello", "add_special_tokens": False, "parse_special": False, "model": "reprolm"}),
    (3, {"tokens": [1, 9690, 28, 49151], "model": "reprolm"}),
]


def request_seeds():
    for endpoint, body in REQUEST_BODIES:
        put("request", bytes([endpoint]) + json.dumps(body).encode())
    for endpoint, raw in [(0, b'{"model": "reprolm", "prompt": "a", "temperature": NaN}'), (1, b"[1, 2]"),
                          (0, b'{"prompt": "\xff"}'), (3, b'{"tokens": [-1, 99999999999999999999]}'),
                          (1, b'{"model": "reprolm", "messages": []}'), (0, b"[" * 5000)]:
        put("request", bytes([endpoint]) + raw)


def main():
    only = set(sys.argv[1:])
    if only:
        for name in only:
            {"grammar": grammar_seeds, "request": request_seeds}[name]()
        return
    grammar_seeds()
    request_seeds()
    small = mini_gguf()
    put("gguf", small)
    put("gguf", mini_gguf(n_vocab=40, alignment=64))
    for n in (24, 64, 200, 1000):
        put("gguf", small[:n])
    put("gguf", MODEL.read_bytes()[:4096])

    # state: mode 0, then the file without its checksum (the target adds it and the fingerprint).
    def state(dtype, overflow, n_keep, capacity, length, tokens, slot_bytes):
        slots = min(length, capacity)
        head = b"RPLMSESS" + struct.pack("<II", 1, 96) + bytes(8) + struct.pack("<4I", 30, 3, 64, 49152)
        head += bytes([dtype, overflow, 0, 0, 0, 0, 0, 0])
        head += struct.pack("<6Q", n_keep, capacity, length, 0 if overflow == 0 else n_keep, len(tokens), slots)
        body = head + struct.pack(f"<{len(tokens)}I", *tokens)
        body += bytes(range(256)) * (slots * slot_bytes // 256) + bytes(slots * slot_bytes % 256)
        return b"\x00" + body
    put("state", state(0, 0, 0, 16, 0, [1, 2, 3], 0))
    put("state", state(1, 1, 2, 8, 0, [], 0))
    put("state", state(1, 0, 0, 4, 1, [1, 9690], 2 * 30 * 192 * 2))
    put("state", state(1, 1, 1, 2, 3, [1, 2, 3], 2 * 30 * 192 * 2))

    texts = []
    for inp in sorted(REF.glob("*.gguf.inp")):
        texts += [t for t in inp.read_text().split("\n__ggml_vocab_test__\n") if t.strip() or t]
    texts += ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|> 3.14159 \u00e9\u00e8 \U0001F600", "\t\n  \r\n"]
    for t in dict.fromkeys(texts):
        put("tokenizer", b"\x00" + t.encode())
        put("tokenizer", b"\x02" + t.encode())
    # Mode bit 0x40: the same texts through the SentencePiece vocabulary (Llama 2), and its
    # byte-fallback tokens as ids.
    for t in dict.fromkeys(texts):
        put("tokenizer", b"\x40" + t.encode())
        put("tokenizer", b"\x42" + t.encode())
    put("tokenizer", b"\x41" + struct.pack("<8I", 1, 243, 162, 169, 156, 29871, 31999, 32000))
    put("tokenizer", b"\x01" + struct.pack("<8I", 1, 9690, 28, 2, 0, 49151, 49152, 200))
    put("tokenizer", b"\x81" + struct.pack("<4I", 0xFFFFFFFF, 5, 0x80000000, 7))

    smollm = str(bytes(gguf.GGUFReader(MODEL).fields["tokenizer.chat_template"].parts[-1]), "utf-8")
    messages = "\0system\0You are nice.\0user\0Hi {{ 7*7 }} <|im_end|>\0assistant\0Hello!\0user\0\x01"
    put("chat", (smollm + messages).encode())
    put("chat", ("\x04" + smollm + "\0user\0\x02").encode())
    for name in ["Qwen-Qwen2.5-7B-Instruct", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "HuggingFaceTB-SmolLM3-3B",
                 "Mistral-Small-3.2-24B-Instruct-2506", "Kimi-K2-Instruct", "LFM2.5-Instruct", "GLM-4.6"]:
        p = REF / "templates" / f"{name}.jinja"
        if p.exists():
            put("chat", (p.read_text() + messages).encode())
    put("chat", b"{% for m in messages %}{{ m.content | upper }}{% endfor %}\0user\0\x03a b c")

    put("sampler", bytes(64))
    put("sampler", bytes(range(200)))
    put("sampler", bytes([63, 3, 0xF0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 3, 2]) + bytes(range(100, 250)))
    put("sampler", bytes([10, 0, 2, 5, 0, 0, 2, 130, 0, 0, 1, 2, 3, 4, 3]) + bytes(100))


if __name__ == "__main__":
    sys.exit(main())
