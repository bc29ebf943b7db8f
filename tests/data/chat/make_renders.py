"""Writes tests/data/chat/renders.json: what Hugging Face transformers renders for real chat
templates, the expected strings of tests/chat_templates.rs.

Run at data-generation time (not in CI), from the repository root, in an environment with
`transformers` and `jinja2` (no torch needed) and `gguf`:

    python3 tests/data/chat/make_renders.py

Each case is one template (a file of templates/, copied unchanged from llama.cpp's
models/templates/, or the `tokenizer.chat_template` of a vocabulary file in ../vocab/), one
conversation, `add_generation_prompt`, the `bos_token` / `eos_token` texts of that family and
extra variables (`tools`; `date_string`, so that the Llama 3 templates do not read the clock).
The expected text is `transformers.utils.chat_template_utils.render_jinja_template`'s output,
or, when the template raises (`raise_exception`), the error message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = Path(__file__).resolve().parent

# template -> (bos_token, eos_token) as the family's tokenizer has them
TEMPLATES: dict[str, tuple[str, str]] = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": ("", "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("<s>", "</s>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "google-gemma-2-2b-it.jinja": ("<bos>", "<eos>"),
    "google-gemma-4-31B-it.jinja": ("<bos>", "<eos>"),
    "HuggingFaceTB-SmolLM3-3B.jinja": ("", "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    # The templates inside the vocabulary files (read from the GGUF, as a model's would be).
    "gguf:ggml-vocab-phi-3.gguf": ("<s>", "<|endoftext|>"),
    "gguf:ggml-vocab-qwen2.gguf": ("<|endoftext|>", "<|endoftext|>"),
    # Templates with transformers' {% generation %} block (assistant-token masks).
    "LFM2.5-8B-A1B.jinja": ("<|startoftext|>", "<|im_end|>"),
    # The Laguna templates write their own special tokens and read neither variable.
    "poolside-Laguna-S-2.1.jinja": ("", ""),
    "poolside-Laguna-XS-2.1.jinja": ("", ""),
    "poolside-Laguna-XS.2.jinja": ("", ""),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
    ("one user turn", [{"role": "user", "content": "Hello!"}], {}),
    ("system and turns", [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "Four, matey."},
        {"role": "user", "content": "And 3+3?  \n"},
    ], {}),
    ("ends with the assistant", [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ], {}),
    ("unicode and markup", [
        {"role": "user", "content": "Übersetze: 数学の証明 🦀 <b>bold</b> {{ not jinja }}"},
    ], {}),
    ("tools offered", [{"role": "user", "content": "Weather in Paris?"}], {"tools": [WEATHER_TOOL]}),
    ("tool call and result", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call0abc1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        ]},
        {"role": "tool", "tool_call_id": "call0abc1", "name": "get_weather", "content": "{\"temp_c\": 18}"},
    ], {"tools": [WEATHER_TOOL]}),
]


def template_source(name: str) -> str:
    if name.startswith("gguf:"):
        reader = gguf.GGUFReader(HERE.parent / "vocab" / name.removeprefix("gguf:"))
        field = reader.fields["tokenizer.chat_template"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return (HERE / "templates" / name).read_text("utf-8")


def main() -> None:
    cases = []
    for name, (bos, eos) in TEMPLATES.items():
        source = template_source(name)
        for title, messages, extra in CONVERSATIONS:
            for add_generation_prompt in (True, False):
                variables = {"date_string": "26 Jul 2024", **extra}
                case: dict[str, Any] = {
                    "template": name, "conversation": title, "messages": messages,
                    "add_generation_prompt": add_generation_prompt, "bos_token": bos, "eos_token": eos,
                    "variables": variables,
                }
                try:
                    rendered = render_jinja_template(
                        conversations=[messages], chat_template=source,
                        add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos,
                        **variables,
                    )
                    if isinstance(rendered, tuple):  # (texts, generation indices)
                        rendered = rendered[0]
                    if isinstance(rendered, list):
                        (rendered,) = rendered
                    case["expected"] = rendered
                except Exception as e:  # the template's own raise_exception, or a failed render
                    case["error"] = str(e)
                cases.append(case)
    out = {"transformers": transformers.__version__, "cases": cases}
    (HERE / "renders.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", "utf-8")
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} raise")


if __name__ == "__main__":
    main()
