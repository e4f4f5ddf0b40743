/* Chat rendering (src/tokenizer/chat.c) against the chat templates rendered by jinja2 and encoded
 * by Hugging Face `tokenizers` (tests/fixtures/chat, made by make_chat_fixtures.py): identical ids,
 * the loss mask equal to the tokens overlapping the assistant spans (by tokenizers' offsets), and
 * each masked run decoding to the assistant text plus its end-of-turn token. Then format choice,
 * loss on all, and the bad-input errors. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "util/fixture_io.h"
#include "util/testutil.h"

static mt_tokenizer *load_tok(const char *rel) { return mt_test_tokenizer_load("%s", rel); }

static const char *lskip_spaces(const char *s) {
    while (*s == ' ') s++;
    return s;
}

static void check_case(json_t *c, size_t lineno) {
    const char *tokdir = json_string_value(json_object_get(c, "tokenizer"));
    const char *fmt_name = json_string_value(json_object_get(c, "format"));
    json_t *ds = json_object_get(c, "default_system");
    json_t *msgs = json_object_get(c, "messages");
    json_t *ref_ids = json_object_get(c, "ids"), *ref_mask = json_object_get(c, "mask");
    json_t *spans = json_object_get(c, "spans");

    mt_tokenizer *t = load_tok(tokdir);
    mt_chat_opts o = {MT_CHAT_AUTO, MT_CHAT_LOSS_ASSISTANT, json_is_string(ds) ? json_string_value(ds) : NULL};
    assert_int_equal(mt_chat_format_parse(fmt_name, &o.format), MT_OK);
    size_t n = json_array_size(msgs);
    mt_chat_message *m = calloc(n, sizeof *m);
    for (size_t i = 0; i < n; i++) {
        m[i].role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
        m[i].content = json_string_value(json_object_get(json_array_get(msgs, i), "content"));
    }
    mt_token_vec ids = {0};
    mt_chat_mask mask = {0};
    int rc = mt_chat_render(t, &o, m, n, &ids, &mask);
    if (rc != MT_OK) print_error("case %zu: %s\n", lineno, mt_error_message());
    assert_int_equal(rc, MT_OK);
    assert_int_equal(ids.n, mask.n);

    int ok = ids.n == json_array_size(ref_ids);
    for (size_t i = 0; ok && i < ids.n; i++) ok = ids.ids[i] == json_integer_value(json_array_get(ref_ids, i));
    int mask_ok = ok;
    for (size_t i = 0; mask_ok && i < ids.n; i++)
        mask_ok = mask.v[i] == json_integer_value(json_array_get(ref_mask, i));
    if (!ok || !mask_ok) {
        print_error("case %zu (%s, %s): %s differ\n  text: %s\n  got: ", lineno, tokdir, fmt_name,
                    ok ? "masks" : "ids", json_string_value(json_object_get(c, "text")));
        for (size_t i = 0; i < ids.n; i++) print_error("%d/%d ", ids.ids[i], mask.v[i]);
        print_error("\n  ref: ");
        for (size_t i = 0; i < json_array_size(ref_ids); i++)
            print_error("%d/%d ", (int)json_integer_value(json_array_get(ref_ids, i)),
                        (int)json_integer_value(json_array_get(ref_mask, i)));
        print_error("\n");
    }
    assert_true(ok);
    assert_true(mask_ok);

    /* each maximal masked run decodes to one assistant span (leading spaces aside: sentencepiece
     * decoders strip the first one) */
    size_t n_runs = 0;
    for (size_t i = 0; i < ids.n;) {
        if (!mask.v[i]) { i++; continue; }
        size_t j = i;
        while (j < ids.n && mask.v[j]) j++;
        assert_true(n_runs < json_array_size(spans));
        char *dec;
        size_t len;
        assert_int_equal(mt_tokenizer_decode(t, ids.ids + i, j - i, 0, &dec, &len), MT_OK);
        const char *want = json_string_value(json_array_get(spans, n_runs));
        /* ... or to a bit of the header before it plus the span, when BPE merged the two into a
         * token that straddles the start (only whitespace in these cases, e.g. "\n" + "\n\n...") */
        const char *d = lskip_spaces(dec), *w = lskip_spaces(want);
        size_t dl = strlen(d), wl = strlen(w), extra = dl >= wl ? dl - wl : 0;
        int run_ok = dl >= wl && strcmp(d + extra, w) == 0 && strspn(d, " \n") >= extra;
        if (!run_ok) print_error("case %zu: masked run %zu decodes to [%s], want [%s]\n", lineno, n_runs, dec, want);
        assert_true(run_ok);
        free(dec);
        n_runs++;
        i = j;
    }
    assert_int_equal(n_runs, json_array_size(spans));

    /* loss on all: the same ids, every token trained; appended after what is already there */
    mt_token_vec ids2 = {0};
    mt_chat_mask mask2 = {0};
    o.loss_on = MT_CHAT_LOSS_ALL;
    assert_int_equal(mt_chat_render(t, &o, m, n, &ids2, &mask2), MT_OK);
    assert_int_equal(mt_chat_render(t, &o, m, n, &ids2, &mask2), MT_OK);
    assert_int_equal(ids2.n, 2 * ids.n);
    assert_int_equal(mask2.n, 2 * ids.n);
    for (size_t i = 0; i < ids2.n; i++) {
        assert_int_equal(ids2.ids[i], ids.ids[i % ids.n]);
        assert_int_equal(mask2.v[i], 1);
    }
    mt_token_vec_free(&ids2);
    mt_chat_mask_free(&mask2);
    mt_token_vec_free(&ids);
    mt_chat_mask_free(&mask);
    free(m);
    mt_tokenizer_free(t);
}

static void test_reference_cases(void **state) {
    (void)state;
    char *path = mt_fixture_path("chat/cases.jsonl");
    FILE *f = fopen(path, "rb");
    if (!f) print_error("cannot open %s\n", path);
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0, n = 0;
    ssize_t got;
    int seen[MT_CHAT_HARMONY + 1] = {0};
    while ((got = getline(&line, &cap, f)) > 0) {
        json_error_t err;
        json_t *c = json_loadb(line, (size_t)got, 0, &err);
        if (!c) print_error("%s:%zu: %s\n", path, n + 1, err.text);
        assert_non_null(c);
        mt_chat_format fmt;
        assert_int_equal(mt_chat_format_parse(json_string_value(json_object_get(c, "format")), &fmt), MT_OK);
        seen[fmt]++;
        check_case(c, ++n);
        json_decref(c);
    }
    free(line);
    fclose(f);
    free(path);
    print_message("%zu reference conversations: chatml %d, llama3 %d, llama2 %d, mistral %d, mistral-v3 %d, "
                  "qwen3 %d, gemma %d, harmony %d\n", n, seen[MT_CHAT_CHATML], seen[MT_CHAT_LLAMA3],
                  seen[MT_CHAT_LLAMA2], seen[MT_CHAT_MISTRAL], seen[MT_CHAT_MISTRAL_V3], seen[MT_CHAT_QWEN3],
                  seen[MT_CHAT_GEMMA], seen[MT_CHAT_HARMONY]);
    assert_true(n >= 120);
    for (int k = MT_CHAT_CHATML; k <= MT_CHAT_MISTRAL_V3; k++) assert_true(seen[k] >= 5);
    assert_true(seen[MT_CHAT_QWEN3] >= 40);
    assert_true(seen[MT_CHAT_GEMMA] >= 8);
    assert_true(seen[MT_CHAT_HARMONY] >= 20);
}

static void test_format_for(void **state) {
    (void)state;
    struct { const char *dir; mt_chat_format f; } want[] = {
        {"tokenizers/qwen2", MT_CHAT_CHATML},     {"tokenizers/llama3", MT_CHAT_LLAMA3},
        {"tokenizers/llama2", MT_CHAT_LLAMA2},    {"tokenizers/mistral", MT_CHAT_LLAMA2},
        {"chat/mistral_inst", MT_CHAT_MISTRAL_V3}, {"chat/qwen3", MT_CHAT_QWEN3},
        {"chat/gemma", MT_CHAT_GEMMA},            {"chat/harmony", MT_CHAT_HARMONY},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        mt_tokenizer *t = load_tok(want[i].dir);
        assert_int_equal(mt_chat_format_for(t), want[i].f);
        /* AUTO renders as the chosen format */
        mt_chat_message m[] = {{"user", "hi"}, {"assistant", "yo"}};
        mt_token_vec a = {0}, b = {0};
        mt_chat_mask ma = {0}, mb = {0};
        mt_chat_opts o = {want[i].f, MT_CHAT_LOSS_ASSISTANT, NULL};
        assert_int_equal(mt_chat_render(t, NULL, m, 2, &a, &ma), MT_OK);
        assert_int_equal(mt_chat_render(t, &o, m, 2, &b, &mb), MT_OK);
        assert_int_equal(a.n, b.n);
        assert_memory_equal(a.ids, b.ids, a.n * sizeof *a.ids);
        assert_memory_equal(ma.v, mb.v, ma.n);
        mt_token_vec_free(&a);
        mt_token_vec_free(&b);
        mt_chat_mask_free(&ma);
        mt_chat_mask_free(&mb);
        mt_tokenizer_free(t);
    }
    mt_chat_format f;
    mt_chat_loss_on l;
    assert_int_equal(mt_chat_format_parse("llama3", &f), MT_OK);
    assert_int_equal(f, MT_CHAT_LLAMA3);
    assert_int_equal(mt_chat_format_parse("jinja", &f), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "jinja"));
    assert_int_equal(mt_chat_loss_on_parse("all", &l), MT_OK);
    assert_int_equal(l, MT_CHAT_LOSS_ALL);
    assert_int_equal(mt_chat_loss_on_parse("prompt", &l), MT_ERR);
    assert_string_equal(mt_chat_format_name(MT_CHAT_MISTRAL), "mistral");
    assert_int_equal(mt_chat_format_parse("mistral-v3", &f), MT_OK);
    assert_int_equal(f, MT_CHAT_MISTRAL_V3);
    assert_int_equal(mt_chat_format_parse("qwen3", &f), MT_OK);
    assert_int_equal(f, MT_CHAT_QWEN3);
    assert_string_equal(mt_chat_format_name(MT_CHAT_QWEN3), "qwen3");
    assert_int_equal(mt_chat_format_parse("gemma", &f), MT_OK);
    assert_int_equal(f, MT_CHAT_GEMMA);
    assert_int_equal(mt_chat_format_parse("harmony", &f), MT_OK);
    assert_int_equal(f, MT_CHAT_HARMONY);
    assert_string_equal(mt_chat_format_name(MT_CHAT_HARMONY), "harmony");
    assert_int_equal(mt_chat_format_parse("gemma4", &f), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "harmony"));
}

/* A tokenizer dir in TMP/NAME: FIXTURE's tokenizer.json, a tokenizer_config.json with CONFIG_JSON
 * and (when not NULL) a chat_template.jinja holding JINJA. */
static mt_tokenizer *tok_with_config(const char *tmp, const char *name, const char *fixture,
                                     const char *config_json, const char *jinja) {
    char *src = mt_fixture_path(fixture), dir[4096], path[4200], cmd[16384];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s/tokenizer.json' '%s/'", dir, src, dir);
    assert_int_equal(system(cmd), 0);
    free(src);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(config_json, f);
    fclose(f);
    if (jinja) {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        f = fopen(path, "wb");
        assert_non_null(f);
        fputs(jinja, f);
        fclose(f);
    }
    mt_tokenizer *t = NULL;
    if (mt_tokenizer_load(&t, dir) != MT_OK) print_error("%s: %s\n", dir, mt_error_message());
    assert_non_null(t);
    return t;
}

/* The chat template, when the tokenizer has one, decides between formats that share special tokens
 * (Llama 2 and Mistral v0.1 have the same <s> </s> vocabulary). */
static void test_format_from_template(void **state) {
    (void)state;
    char *tmp = mt_test_tmpdir();
    struct { const char *name, *fixture, *config, *jinja; mt_chat_format want; } cases[] = {
        {"m_tmpl", "tokenizers/mistral",
         "{\"chat_template\": \"{{ bos_token }}{% for m in messages %}{{ ' [INST] ' + m['content'] + ' [/INST]' }}{% endfor %}\"}",
         NULL, MT_CHAT_MISTRAL},
        {"l2_tmpl", "tokenizers/mistral",
         "{\"chat_template\": \"{{ '<<SYS>>\\\\n' }}{{ '[INST] ' }}\"}", NULL, MT_CHAT_LLAMA2},
        {"m_jinja", "tokenizers/llama2", "{\"eos_token\": \"</s>\"}", "{{ '[INST] ' + x + ' [/INST]' }}",
         MT_CHAT_MISTRAL},
        {"m_list", "tokenizers/llama2",
         "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"<|im_start|>\"},"
         " {\"name\": \"default\", \"template\": \"[INST]\"}]}", NULL, MT_CHAT_MISTRAL},
        {"q_tmpl", "tokenizers/qwen2", "{\"chat_template\": \"<|im_start|>{{ x }}\"}", NULL, MT_CHAT_CHATML},
        {"q3_jinja", "tokenizers/qwen2", "{}",
         "{{ '<|im_start|>' }}{% if message.reasoning_content %}{{ '<think>\\n' }}{% endif %}", MT_CHAT_QWEN3},
        /* QwQ-like: splits off </think> but has no reasoning_content: plain ChatML */
        {"qwq_jinja", "tokenizers/qwen2", "{}",
         "{{ '<|im_start|>' + message.content.split('</think>')[-1] }}{{ '<think>\\n' }}", MT_CHAT_CHATML},
        {"l3_tmpl", "tokenizers/llama3", "{\"chat_template\": \"<|start_header_id|>\"}", NULL, MT_CHAT_LLAMA3},
        {"unknown_tmpl", "tokenizers/llama3", "{\"chat_template\": \"{{ x }}\"}", NULL, MT_CHAT_LLAMA3},
        {"gemma_tmpl", "tokenizers/llama2", "{\"chat_template\": \"{{ '<start_of_turn>' + role }}\"}", NULL,
         MT_CHAT_GEMMA},
        {"harmony_jinja", "tokenizers/gpt2", "{}", "{{- '<|start|>assistant<|channel|>final<|message|>' }}",
         MT_CHAT_HARMONY},
        /* by the tokens when the template says nothing known ... */
        {"gemma_tokens", "chat/gemma", "{\"chat_template\": \"{{ x }}\"}", NULL, MT_CHAT_GEMMA},
        {"harmony_tokens", "chat/harmony", "{\"chat_template\": \"{{ x }}\"}", NULL, MT_CHAT_HARMONY},
        /* ... but a Gemma 4 template (<|turn>) is not Gemma 3's format, whatever the tokens */
        {"gemma4_tmpl", "chat/gemma", "{\"chat_template\": \"{{ '<|turn>user\\\\n' }}\"}", NULL, MT_CHAT_LLAMA2},
    };
    /* the real Qwen3 template (tests/fixtures/chat/qwen3) as tokenizer_config.json's chat_template */
    char *q3_path = mt_fixture_path("chat/qwen3/chat_template.jinja");
    FILE *qf = fopen(q3_path, "rb");
    assert_non_null(qf);
    char q3[8192];
    size_t q3n = fread(q3, 1, sizeof q3 - 1, qf);
    assert_true(q3n > 1000 && q3n < sizeof q3 - 1);
    q3[q3n] = 0;
    fclose(qf);
    free(q3_path);
    json_t *cfg = json_pack("{s:s}", "chat_template", q3);
    char *q3_config = json_dumps(cfg, 0);
    json_decref(cfg);
    mt_tokenizer *q3t = tok_with_config(tmp, "q3_config", "tokenizers/qwen2", q3_config, NULL);
    assert_int_equal(mt_chat_format_for(q3t), MT_CHAT_QWEN3);
    mt_tokenizer_free(q3t);
    free(q3_config);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mt_tokenizer *t = tok_with_config(tmp, cases[i].name, cases[i].fixture, cases[i].config, cases[i].jinja);
        assert_non_null(mt_tokenizer_chat_template(t));
        if (mt_chat_format_for(t) != cases[i].want)
            print_error("%s: got %s, want %s\n", cases[i].name, mt_chat_format_name(mt_chat_format_for(t)),
                        mt_chat_format_name(cases[i].want));
        assert_int_equal(mt_chat_format_for(t), cases[i].want);
        mt_tokenizer_free(t);
    }
    /* a chat_template that is neither a string nor a list: refused, naming the file */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/bad_tmpl", tmp);
    char cmd[16384], *src = mt_fixture_path("tokenizers/llama2");
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s/tokenizer.json' '%s/' && echo '{\"chat_template\": 7}' > "
             "'%s/tokenizer_config.json'", dir, src, dir, dir);
    assert_int_equal(system(cmd), 0);
    free(src);
    mt_tokenizer *t = NULL;
    assert_int_equal(mt_tokenizer_load(&t, dir), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "tokenizer_config.json: chat_template"));
    mt_test_rmtree(tmp);
    free(tmp);
}

static void expect_bad(const mt_tokenizer *t, mt_chat_format f, const mt_chat_message *m, size_t n,
                       const char *needle) {
    /* something already in the vectors, which an error must leave as it was */
    mt_token_vec ids = {malloc(2 * sizeof(int32_t)), 2, 2};
    mt_chat_mask mask = {malloc(2), 2, 2};
    ids.ids[0] = ids.ids[1] = 7;
    mask.v[0] = mask.v[1] = 1;
    size_t n0 = ids.n;
    mt_chat_opts o = {f, MT_CHAT_LOSS_ASSISTANT, NULL};
    mt_error_clear();
    assert_int_equal(mt_chat_render(t, &o, m, n, &ids, &mask), MT_ERR);
    if (!strstr(mt_error_message(), needle))
        print_error("error [%s] lacks [%s]\n", mt_error_message(), needle);
    assert_non_null(strstr(mt_error_message(), needle));
    assert_int_equal(ids.n, n0); /* left as it was */
    assert_int_equal(mask.n, n0);
    mt_token_vec_free(&ids);
    mt_chat_mask_free(&mask);
}

static void test_bad_input(void **state) {
    (void)state;
    mt_tokenizer *qwen = load_tok("tokenizers/qwen2");
    mt_tokenizer *llama2 = load_tok("tokenizers/llama2");
    mt_tokenizer *gpt2 = load_tok("tokenizers/gpt2");
    mt_chat_message no_role[] = {{"user", "a"}, {NULL, "b"}};
    mt_chat_message no_content[] = {{"user", NULL}};
    mt_chat_message bad_role[] = {{"user", "a"}, {"tool", "b"}};
    mt_chat_message twice_user[] = {{"system", "s"}, {"user", "a"}, {"user", "b"}};
    mt_chat_message mid_system[] = {{"user", "a"}, {"system", "b"}, {"assistant", "c"}};
    mt_chat_message starts_assistant[] = {{"assistant", "a"}};
    mt_chat_message only_system[] = {{"system", "s"}};
    mt_chat_message fine[] = {{"user", "a"}};
    mt_chat_message developer[] = {{"developer", "d"}, {"user", "a"}};
    mt_tokenizer *inst = load_tok("chat/mistral_inst");
    mt_tokenizer *gemma = load_tok("chat/gemma"), *harmony = load_tok("chat/harmony");
    for (int f = MT_CHAT_CHATML; f <= MT_CHAT_HARMONY; f++) {
        const mt_tokenizer *t = f == MT_CHAT_CHATML || f == MT_CHAT_QWEN3 ? qwen
                                : f == MT_CHAT_LLAMA3                      ? load_tok("tokenizers/llama3")
                                : f == MT_CHAT_MISTRAL_V3                  ? inst
                                : f == MT_CHAT_GEMMA                       ? gemma
                                : f == MT_CHAT_HARMONY                     ? harmony
                                                                           : llama2;
        expect_bad(t, f, no_role, 2, "message 1 has no role");
        expect_bad(t, f, no_content, 1, "message 0 (user) has no content");
        expect_bad(t, f, bad_role, 2, "unknown role \"tool\"");
        expect_bad(t, f, fine, 0, "empty conversation");
        if (f != MT_CHAT_HARMONY) expect_bad(t, f, developer, 2, "message 0: role \"developer\"");
        if (f == MT_CHAT_HARMONY) expect_bad(t, f, mid_system, 3, "message 1: role \"system\" after the first");
        if ((f >= MT_CHAT_LLAMA2 && f <= MT_CHAT_MISTRAL_V3) || f == MT_CHAT_GEMMA) {
            expect_bad(t, f, twice_user, 3, "message 2: role \"user\"");
            expect_bad(t, f, mid_system, 3, "message 1: role \"system\"");
            expect_bad(t, f, starts_assistant, 1, "message 0: role \"assistant\"");
            expect_bad(t, f, only_system, 1, "only a system message");
        }
        if (f == MT_CHAT_LLAMA3) mt_tokenizer_free((mt_tokenizer *)t);
    }
    /* a tokenizer without the format's special tokens */
    expect_bad(gpt2, MT_CHAT_CHATML, fine, 1, "<|im_start|>");
    expect_bad(gpt2, MT_CHAT_LLAMA3, fine, 1, "<|begin_of_text|>");
    expect_bad(gpt2, MT_CHAT_QWEN3, fine, 1, "<|im_start|>");
    expect_bad(llama2, MT_CHAT_MISTRAL_V3, fine, 1, "[INST]");
    expect_bad(llama2, MT_CHAT_GEMMA, fine, 1, "<bos>");
    expect_bad(gpt2, MT_CHAT_HARMONY, fine, 1, "<|start|>");
    /* harmony: channel tags in the content (the template refuses them too), later developer */
    mt_chat_message tags[] = {{"user", "a"}, {"assistant", "<|channel|>final<|message|>x"}};
    expect_bad(harmony, MT_CHAT_HARMONY, tags, 2, "message 1: assistant content holds <|channel|> tags");
    mt_chat_message late_dev[] = {{"user", "a"}, {"developer", "d"}};
    expect_bad(harmony, MT_CHAT_HARMONY, late_dev, 2, "message 1: role \"developer\" after the first");
    mt_tokenizer_free(gemma);
    mt_tokenizer_free(harmony);
    mt_tokenizer_free(inst);
    mt_tokenizer_free(qwen);
    mt_tokenizer_free(llama2);
    mt_tokenizer_free(gpt2);
}

static void render_text(const mt_tokenizer *t, const mt_chat_opts *o, const mt_chat_message *m, size_t n,
                        char **text, mt_chat_mask *mask) {
    mt_token_vec ids = {0};
    mask->n = 0;
    if (mt_chat_render(t, o, m, n, &ids, mask) != MT_OK) print_error("%s\n", mt_error_message());
    assert_int_equal(ids.n, mask->n);
    size_t len;
    assert_int_equal(mt_tokenizer_decode(t, ids.ids, ids.n, 0, text, &len), MT_OK);
    mt_token_vec_free(&ids);
}

/* Harmony: the date (opts.date, else the fixed default; a bad one refused), "developer" as the first
 * message is the system message's place, and what is trained: the final channel and its closing
 * token, not the analysis message (kept only in the last turn). */
static void test_harmony(void **state) {
    (void)state;
    mt_tokenizer *t = load_tok("chat/harmony");
    mt_chat_message sys[] = {{"system", "Be brief."}, {"user", "q"}, {"assistant", "<think>r1</think>a1"},
                             {"user", "q2"}, {"assistant", "<think>\nr2\n</think>\n\na2"}};
    mt_chat_message dev[] = {{"developer", "Be brief."}, {"user", "q"}, {"assistant", "<think>r1</think>a1"},
                             {"user", "q2"}, {"assistant", "<think>\nr2\n</think>\n\na2"}};
    mt_chat_opts o = {MT_CHAT_HARMONY, MT_CHAT_LOSS_ASSISTANT, NULL, NULL};
    mt_chat_mask mask = {0};
    char *a, *b;
    render_text(t, &o, sys, 5, &a, &mask);
    render_text(t, &o, dev, 5, &b, &mask);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "Current date: " MT_CHAT_HARMONY_DEFAULT_DATE "\n\nReasoning: medium\n\n"));
    assert_non_null(strstr(a, "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"));
    assert_null(strstr(a, "r1")); /* an earlier turn's reasoning is dropped */
    assert_non_null(strstr(a, "<|start|>assistant<|channel|>final<|message|>a1<|end|>"));
    assert_non_null(strstr(a, "<|start|>assistant<|channel|>analysis<|message|>r2<|end|>"
                              "<|start|>assistant<|channel|>final<|message|>a2<|return|>"));
    size_t trained = 0;
    for (size_t i = 0; i < mask.n; i++) trained += mask.v[i];
    assert_true(trained >= 4 && trained <= 8); /* a1 <|end|> a2 <|return|>: few tokens, not r2 */
    free(a);
    free(b);
    o.date = "2030-01-31";
    render_text(t, &o, sys, 5, &a, &mask);
    assert_non_null(strstr(a, "Current date: 2030-01-31\n"));
    free(a);
    o.date = "31.01.2030";
    mt_token_vec ids = {0};
    assert_int_equal(mt_chat_render(t, &o, sys, 5, &ids, &mask), MT_ERR);
    assert_non_null(strstr(mt_error_message(), "31.01.2030"));
    mt_token_vec_free(&ids);
    mt_chat_mask_free(&mask);
    mt_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_cases),
        cmocka_unit_test(test_format_for),
        cmocka_unit_test(test_format_from_template),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_harmony),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
