/* Writes the seed corpora of the fuzz targets from the fixtures: fz_seeds SRC_DIR OUT_DIR makes
 * OUT_DIR/<target>/ for every target. Files are copied, joined into the multi-file inputs
 * (fz_util.h), or, where the fixtures hold no such file (packed rows, checkpoints, small
 * safetensors), written by the library's own writers from fixture data. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "fz_util.h"
#include "data/chat_pack.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "data/packed.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"
#include "tokenizer/chat.h"

static const char *src, *out;
static int n_written;

static void die(const char *what) {
    fprintf(stderr, "fz_seeds: %s: %s\n", what, mt_error_message()[0] ? mt_error_message() : strerror(errno));
    exit(1);
}

/* A growable byte buffer. */
typedef struct {
    char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) die("realloc");
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_byte(buf *b, int c) {
    unsigned char x = (unsigned char)c;
    put(b, &x, 1);
}

/* Appends file PATH (0 when it does not exist). */
static int put_file(buf *b, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) put(b, chunk, k);
    fclose(f);
    return 1;
}

static void put_fixture(buf *b, const char *rel) {
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/fixtures/%s", src, rel);
    if (!put_file(b, p)) die(p);
}

static void sep(buf *b) { put(b, FZ_SEP, FZ_SEP_LEN); }

/* Writes OUT/target/name and resets b. */
static void emit(const char *target, const char *name, buf *b) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", out, target);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/%s", out, target, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(b->p, 1, b->n, f) != b->n || fclose(f) != 0) die(p);
    b->n = 0;
    n_written++;
}

static const char *const MODELS[] = {"llama3_rope_tied", "llama_bias",  "llama_gqa",  "mistral_gqa",
                                     "qwen2_bias_tied",  "qwen3_qknorm", "train_llama", "train_qwen2_tied"};
enum { N_MODELS = sizeof MODELS / sizeof *MODELS };

/* ---- safetensors, index, config ---- */

static void seeds_safetensors(void) {
    buf b = {0};
    char rel[256], name[256];
    for (int i = 0; i < N_MODELS; i++) {
        snprintf(rel, sizeof rel, "%s/model.safetensors", MODELS[i]);
        put_fixture(&b, rel);
        snprintf(name, sizeof name, "%s-model", MODELS[i]);
        emit("fuzz_safetensors", name, &b);
    }
    put_fixture(&b, "llama_bf16_sharded/model-00002-of-00002.safetensors");
    emit("fuzz_safetensors", "llama_bf16_sharded-shard2", &b);
    /* every dtype, a scalar, an empty tensor and metadata, in a few hundred bytes */
    static const float f32[6] = {1, -2, 3.5f, 0, INFINITY, 1e-30f};
    static const uint16_t h16[4] = {0x3f80, 0xc000, 0x7fc0, 1};
    static const int32_t i32 = 7;
    static const int64_t i64[2] = {-1, 1};
    static const uint8_t u8[3] = {0, 1, 255};
    mt_st_write_tensor t[] = {
        {"a.f32", MT_F32, 2, {2, 3}, f32}, {"b.bf16", MT_BF16, 1, {4}, h16},
        {"c.f16", MT_F16, 2, {2, 2}, h16}, {"d.scalar", MT_I32, 0, {0}, &i32},
        {"e.i64", MT_I64, 1, {2}, i64},    {"f.u16", MT_U16, 1, {4}, h16},
        {"g.u8", MT_U8, 1, {3}, u8},       {"h.empty", MT_F32, 2, {0, 5}, f32},
    };
    mt_st_meta meta[] = {{"format", "pt"}, {"note", "fz_seeds"}};
    const char *tmp = fz_path(0, "small.safetensors");
    if (mt_safetensors_write(tmp, t, sizeof t / sizeof *t, meta, 2) != MT_OK) die(tmp);
    put_file(&b, tmp);
    emit("fuzz_safetensors", "small-all-dtypes", &b);
    free(b.p);
}

static void seeds_index(const mt_param_table *tiny) {
    buf b = {0};
    put_fixture(&b, "llama_bf16_sharded/model.safetensors.index.json");
    sep(&b);
    put_fixture(&b, "llama_bf16_sharded/model-00001-of-00002.safetensors");
    sep(&b);
    put_fixture(&b, "llama_bf16_sharded/model-00002-of-00002.safetensors");
    emit("fuzz_safetensors_index", "llama_bf16_sharded", &b);
    /* the tiny model saved in two shards by the library's writer: a small input */
    float *w = calloc((size_t)tiny->total, sizeof(float));
    for (int64_t i = 0; i < tiny->total; i++) w[i] = (float)(i % 7) - 3;
    const char *dir = fz_path(0, "tiny-sharded");
    int64_t max = tiny->n_real * 2 * 3 / 5; /* 60% of the bf16 bytes: two shards */
    if (mt_model_save(tiny, w, dir, MT_BF16, max) != MT_OK) die(dir);
    static const char *const files[] = {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors"};
    char p[1024];
    for (int i = 0; i < 3; i++) {
        if (i) sep(&b);
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (!put_file(&b, p)) die(p);
    }
    emit("fuzz_safetensors_index", "tiny-bf16", &b);
    free(w);
    free(b.p);
}

static void seeds_config(void) {
    buf b = {0};
    char rel[256], p[1024];
    for (int i = 0; i < N_MODELS; i++) {
        snprintf(rel, sizeof rel, "%s/config.json", MODELS[i]);
        put_fixture(&b, rel);
        emit("fuzz_config", MODELS[i], &b);
    }
    put_fixture(&b, "llama_bf16_sharded/config.json");
    emit("fuzz_config", "llama_bf16_sharded", &b);
    snprintf(p, sizeof p, "%s/configs/tiny-bytes.json", src);
    if (put_file(&b, p)) emit("fuzz_config", "configs-tiny-bytes", &b);
    put(&b, FZ_CKPT_CONFIG, strlen(FZ_CKPT_CONFIG));
    emit("fuzz_config", "fz-ckpt-config", &b);
    free(b.p);
}

/* ---- tokenizers ---- */

static void seeds_tokenizer_load(void) {
    buf b = {0};
    char rel[256], name[256];
    for (int k = 0; k < FZ_N_TOKENIZERS; k++) {
        const char *d = FZ_TOKENIZERS[k];
        snprintf(rel, sizeof rel, "%s/tokenizer.json", d);
        put_fixture(&b, rel);
        sep(&b);
        snprintf(rel, sizeof rel, "%s/tokenizer_config.json", d);
        put_fixture(&b, rel);
        char p[1024];
        snprintf(p, sizeof p, "%s/tests/fixtures/%s/chat_template.jinja", src, d);
        struct stat sb;
        if (stat(p, &sb) == 0) {
            sep(&b);
            put_file(&b, p);
        }
        snprintf(name, sizeof name, "%s", strchr(d, '/') + 1);
        emit("fuzz_tokenizer_load", name, &b);
    }
    static const char *const bad[] = {"decoder_wordpiece", "malformed", "merge_oov", "no_vocab",
                                      "normalizer_lowercase", "not_object", "pretok_whitespace",
                                      "unigram", "wordpiece"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(rel, sizeof rel, "tokenizers/bad/%s.json", bad[i]);
        put_fixture(&b, rel);
        snprintf(name, sizeof name, "bad-%s", bad[i]);
        emit("fuzz_tokenizer_load", name, &b);
    }
    free(b.p);
}

/* Calls fn on every JSON line of a fixture JSONL file. */
static void each_jsonl(const char *rel, void (*fn)(json_t *, int, void *), void *ctx) {
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/fixtures/%s", src, rel);
    FILE *f = fopen(p, "rb");
    if (!f) die(p);
    char *line = NULL;
    size_t cap = 0;
    int i = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL);
        if (json_is_object(j)) fn(j, i++, ctx);
        json_decref(j);
    }
    free(line);
    fclose(f);
}

typedef struct {
    int k;
    buf b;
} tok_ctx;

static void one_text(json_t *c, int i, void *vctx) {
    tok_ctx *x = vctx;
    json_t *text = json_object_get(c, "text");
    if (i % 6 != 0 || !json_is_string(text)) return;
    put_byte(&x->b, x->k | (i % 12 == 0 ? 0x10 : 0));
    put(&x->b, json_string_value(text), json_string_length(text));
    char name[64];
    snprintf(name, sizeof name, "%d-case%03d", x->k, i);
    emit("fuzz_tokenizer_encode", name, &x->b);
}

static void one_ids(json_t *c, int i, void *vctx) {
    tok_ctx *x = vctx;
    json_t *ids = json_object_get(c, "ids_special");
    if (i % 6 != 0 || !json_is_array(ids)) return;
    put_byte(&x->b, x->k | ((i / 6) % 4) << 4);
    size_t j;
    json_t *v;
    json_array_foreach(ids, j, v) {
        json_int_t id = json_integer_value(v);
        put_byte(&x->b, (int)(id & 0xff));
        put_byte(&x->b, (int)((id >> 8) & 0xff));
    }
    char name[64];
    snprintf(name, sizeof name, "%d-case%03d", x->k, i);
    emit("fuzz_tokenizer_decode", name, &x->b);
}

static void seeds_encode_decode(void) {
    for (int k = 0; k < 5; k++) { /* the five tokenizers/ kinds have cases.jsonl */
        tok_ctx x = {k, {0}};
        char rel[256];
        snprintf(rel, sizeof rel, "%s/cases.jsonl", FZ_TOKENIZERS[k]);
        each_jsonl(rel, one_text, &x);
        each_jsonl(rel, one_ids, &x);
        free(x.b.p);
    }
}

/* ---- chat JSONL ---- */

typedef struct {
    buf b;
    char key[128]; /* tokenizer + format of the lines in b */
    int lines, sel, seeds;
} chat_ctx;

static void chat_flush(chat_ctx *x) {
    if (!x->lines) return;
    buf h = {0};
    put_byte(&h, x->sel);
    put_byte(&h, (x->seeds % 8) | 6 << 3); /* options vary; T 256 */
    put(&h, x->b.p, x->b.n);
    char name[64];
    snprintf(name, sizeof name, "chat%03d", x->seeds++);
    emit("fuzz_chat_pack", name, &h);
    free(h.p);
    x->b.n = 0;
    x->lines = 0;
}

static void one_chat(json_t *c, int i, void *vctx) {
    chat_ctx *x = vctx;
    const char *tok = json_string_value(json_object_get(c, "tokenizer"));
    const char *fmt = json_string_value(json_object_get(c, "format"));
    json_t *msgs = json_object_get(c, "messages");
    if (!tok || !fmt || !json_is_array(msgs)) return;
    int k = -1;
    for (int j = 0; j < FZ_N_TOKENIZERS; j++)
        if (strcmp(FZ_TOKENIZERS[j], tok) == 0) k = j;
    mt_chat_format f;
    if (k < 0 || mt_chat_format_parse(fmt, &f) != MT_OK) return;
    char key[128];
    snprintf(key, sizeof key, "%s %s", tok, fmt);
    if (strcmp(key, x->key) != 0 || x->lines == 3) chat_flush(x);
    snprintf(x->key, sizeof x->key, "%s", key);
    x->sel = k | (int)f << 3;
    json_t *line = json_pack("{sO}", "messages", msgs);
    char *s = json_dumps(line, JSON_COMPACT);
    put(&x->b, s, strlen(s));
    put_byte(&x->b, '\n');
    free(s);
    json_decref(line);
    x->lines++;
}

static void seeds_chat(void) {
    chat_ctx x = {{0}, "", 0, 0, 0};
    each_jsonl("chat/cases.jsonl", one_chat, &x);
    chat_flush(&x);
    free(x.b.p);
}

/* ---- token files and packed rows, from the training fixture's tokens ---- */

static void seeds_tokens_packed(void) {
    buf data = {0}, b = {0};
    put_fixture(&data, "train_llama/data.bin"); /* uint16 ids, vocab 96 */
    const uint16_t *ids16 = (const uint16_t *)data.p;
    size_t n = data.n / 2;
    put_byte(&b, 2 << 1); /* uint16, vocab 96 */
    put(&b, data.p, data.n);
    emit("fuzz_tokens", "train_llama-u16", &b);
    put_byte(&b, 2 << 1);
    put(&b, data.p, 64);
    emit("fuzz_tokens", "train_llama-u16-short", &b);
    put_byte(&b, 1 | 2 << 1); /* uint32 */
    for (size_t i = 0; i < 40; i++) {
        uint32_t v = ids16[i];
        put(&b, &v, 4);
    }
    emit("fuzz_tokens", "train_llama-u32-short", &b);
    put_byte(&b, 2 << 1);
    put(&b, data.p, 4); /* two tokens: the least a file holds */
    emit("fuzz_tokens", "two-tokens", &b);

    int32_t *ids = malloc(sizeof(int32_t) * n);
    uint8_t *trained = malloc(n);
    for (size_t i = 0; i < n; i++) ids[i] = ids16[i], trained[i] = i % 3 != 0;
    static const struct { int T, vocab, id_size; mt_pack_policy p; const char *name; } kinds[] = {
        {8, 96, 2, MT_PACK_WHOLE, "t8-whole-u16"}, {8, 96, 2, MT_PACK_SPLIT, "t8-split-u16"},
        {5, 70000, 4, MT_PACK_WHOLE, "t5-whole-u32"}, {1, 96, 2, MT_PACK_SPLIT, "t1-split"},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        mt_packed_writer w;
        const char *p = fz_path(0, "seed.packed");
        if (mt_packed_writer_open(&w, p, kinds[k].T, kinds[k].vocab, kinds[k].id_size, 0, kinds[k].p) != MT_OK)
            die(p);
        size_t at = 0;
        for (int d = 0; d < 6; d++) { /* documents of 1 .. T+1 tokens */
            size_t len = 1 + (size_t)(d * 3) % (size_t)(kinds[k].T + 1);
            if (mt_packed_writer_add(&w, ids + at, trained + at, len) != MT_OK) die(p);
            at += len;
        }
        if (mt_packed_writer_commit(&w) != MT_OK) die(p);
        put_file(&b, p);
        emit("fuzz_packed", kinds[k].name, &b);
    }
    free(ids);
    free(trained);
    free(data.p);
    free(b.p);
}

/* A packed file as the chat packer writes it (ids in uint16, a real loss mask). */
static void seed_packed_from_chat(void) {
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/fixtures/tokenizers/qwen2", src);
    mt_tokenizer *t;
    if (mt_tokenizer_load(&t, p) != MT_OK) die(p);
    const char *in = fz_path(1, "seed.jsonl"), *o = fz_path(2, "chat.packed");
    FILE *f = fopen(in, "w");
    fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
          "\"content\": \"Hello there.\"}]}\n{\"messages\": [{\"role\": \"system\", \"content\": \"Be "
          "brief.\"}, {\"role\": \"user\", \"content\": \"2+2?\"}, {\"role\": \"assistant\", "
          "\"content\": \"4\"}]}\n", f);
    fclose(f);
    mt_chat_pack_opts opts = {.format = MT_CHAT_AUTO, .T = 32};
    if (mt_chat_pack(t, &in, 1, o, &opts, NULL) != MT_OK) die(o);
    buf b = {0};
    put_file(&b, o);
    emit("fuzz_packed", "chat-qwen2-t32", &b);
    free(b.p);
    mt_tokenizer_free(t);
}

/* ---- checkpoints of the tiny model ---- */

static void seeds_checkpoint(const mt_param_table *tiny) {
    static const struct { int64_t step; double loss; mt_state_format f; const char *name; } kinds[] = {
        {3, 2.5, MT_STATE_FULL, "step3"}, {0, NAN, MT_STATE_FULL, "step0-loss-null"},
        {4, 1.5, MT_STATE_COMPACT, "step4-compact"}, {5, 1.0, MT_STATE_TIGHT, "step5-tight"},
    };
    float *w = malloc(sizeof(float) * (size_t)tiny->total);
    buf b = {0};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        fz_state *fs = fz_state_create(kinds[k].f, tiny);
        fs->io.sr_seed = 987654321;
        for (int i = 0; i < tiny->n_params; i++) { /* weights only: moments stay zero */
            const mt_param *p = &tiny->params[i];
            for (int64_t j = 0; j < p->numel; j++) w[j] = (float)((j + i) % 5) * 0.25f - 0.5f;
            if (fs->io.set_weights(fs, p, w) != MT_OK) die(p->name);
        }
        const char *o = fz_path(0, "ckpt-out");
        mt_ckpt_state st = {kinds[k].step, 1234567890123ull, kinds[k].loss};
        if (mt_checkpoint_save(o, tiny, &fs->io, &st, "{\"lr\": 0.001}", NULL, 0) != MT_OK) die(o);
        fz_state_free(fs);
        static const char *const files[] = {"trainer_state.json", "config.json", "model.safetensors",
                                            "optimizer.safetensors"};
        char p[1024];
        for (int i = 0; i < 4; i++) {
            if (i) sep(&b);
            snprintf(p, sizeof p, "%s/checkpoints/step_%08lld/%s", o, (long long)kinds[k].step, files[i]);
            if (!put_file(&b, p)) die(p);
        }
        emit("fuzz_checkpoint", kinds[k].name, &b);
    }
    free(w);
    free(b.p);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fz_seeds SRC_DIR OUT_DIR\n");
        return 2;
    }
    src = argv[1], out = argv[2];
    if (mkdir(out, 0755) != 0 && errno != EEXIST) die(out);
    mt_config cfg;
    if (mt_config_parse(&cfg, FZ_CKPT_CONFIG, "FZ_CKPT_CONFIG") != MT_OK) die("FZ_CKPT_CONFIG");
    mt_param_table tiny;
    mt_param_table_init(&tiny, &cfg);
    seeds_safetensors();
    seeds_index(&tiny);
    seeds_config();
    seeds_tokenizer_load();
    seeds_encode_decode();
    seeds_chat();
    seeds_tokens_packed();
    seed_packed_from_chat();
    seeds_checkpoint(&tiny);
    mt_param_table_free(&tiny);
    printf("fz_seeds: %d seeds in %s\n", n_written, out);
    return 0;
}
