// Tokenizes texts with llama.cpp's own tokenizer, for reprolm's reference data (not built by
// the project: see ../README.md). Usage: vocab_tokenize VOCAB.gguf TEXTS ADD_SPECIAL PARSE_SPECIAL
// TEXTS holds texts separated by "\n__ggml_vocab_test__\n" (llama.cpp's .inp format, trailing
// separator included); prints one line of space-separated ids per text.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"

static void quiet(enum ggml_log_level level, const char * text, void * data) { (void) level; (void) text; (void) data; }

int main(int argc, char ** argv) {
    if (argc != 5) { fprintf(stderr, "usage: %s VOCAB TEXTS ADD_SPECIAL PARSE_SPECIAL\n", argv[0]); return 2; }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[1], params);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    FILE * f = fopen(argv[2], "rb");
    if (!f) { perror(argv[2]); return 1; }
    fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    char * buf = malloc(n + 1);
    if (fread(buf, 1, n, f) != (size_t) n) { return 1; }
    buf[n] = 0;
    const char * sep = "\n__ggml_vocab_test__\n";
    const bool add_special = atoi(argv[3]) != 0, parse_special = atoi(argv[4]) != 0;
    char * p = buf;
    // memmem, not strstr: a text may contain NUL bytes.
    for (char * end; (end = memmem(p, (size_t) (buf + n - p), sep, strlen(sep))) != NULL; p = end + strlen(sep)) {
        int32_t len = (int32_t) (end - p);
        int32_t cap = len + 16;
        llama_token * ids = malloc(sizeof(llama_token) * cap);
        int32_t k = llama_tokenize(vocab, p, len, ids, cap, add_special, parse_special);
        if (k < 0) { fprintf(stderr, "buffer too small\n"); return 1; }
        for (int32_t i = 0; i < k; i++) printf(" %d", ids[i]);
        printf("\n");
        free(ids);
    }
    llama_model_free(model);
    return 0;
}
