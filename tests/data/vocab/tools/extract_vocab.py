"""Writes a vocabulary-only GGUF (no tensors) with the tokenizer metadata of a model file, the
way llama.cpp's ggml-vocab-*.gguf files are: `general.*` and `tokenizer.*` keys only.

    python3 tests/data/vocab/tools/extract_vocab.py MODEL.gguf OUT.gguf
"""

from __future__ import annotations

import sys

import gguf


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if not (key.startswith("general.") or key.startswith("tokenizer.")):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), value_type, sub_type=sub_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
