/* --data: token files, packed rows, and the text / chat data turned into them (see run_data.h). */
#include "data/run_data.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "data/byte_text.h"
#include "data/map_guard.h"
#include "data/text_data.h"
#include "tokenizer/tokenizer.h"

#define BYTE_EOS 256

static int is_token_file(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot && (!strcmp(dot, ".bin") || !strcmp(dot, ".tokens"));
}

/* ---- derived files and their sidecars ---- */

/* {"path", "size", "mtime_ns"} of a file, or JSON null when there is none. */
static json_t *file_id(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return json_null();
    char real[PATH_MAX];
    if (!realpath(path, real)) snprintf(real, sizeof real, "%s", path);
    return json_pack("{s:s, s:I, s:I}", "path", real, "size", (json_int_t)st.st_size, "mtime_ns",
                     (json_int_t)((long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec));
}

static void sidecar_of(const char *file, char *out, size_t size) { snprintf(out, size, "%s.json", file); }

/* Puts FILE's size (and INDEX's, when not NULL) into key; 0 when one is missing. */
static int put_sizes(json_t *key, const char *file, const char *index) {
    struct stat st;
    if (stat(file, &st) != 0) return 0;
    json_object_set_new(key, "file_size", json_integer((json_int_t)st.st_size));
    if (!index) return 1;
    if (stat(index, &st) != 0) return 0;
    json_object_set_new(key, "index_size", json_integer((json_int_t)st.st_size));
    return 1;
}

static void del_sizes(json_t *key) {
    json_object_del(key, "file_size");
    json_object_del(key, "index_size");
}

/* 1 when FILE (and its document INDEX, when not NULL) exists and its sidecar holds exactly key plus
 * their current sizes. */
static int derived_fresh(const char *file, const char *index, json_t *key) {
    char sidecar[PATH_MAX + 8];
    sidecar_of(file, sidecar, sizeof sidecar);
    json_t *have = json_load_file(sidecar, 0, NULL);
    int same = have && put_sizes(key, file, index) && json_equal(have, key);
    del_sizes(key);
    json_decref(have);
    return same;
}

/* Before FILE is remade: no sidecar, so a crash from here on leaves nothing trusted. */
static void derived_forget(const char *file) {
    char sidecar[PATH_MAX + 8];
    sidecar_of(file, sidecar, sizeof sidecar);
    unlink(sidecar);
}

/* After FILE (and INDEX) was made: its sidecar, written to a temporary and renamed (last of all). */
static int derived_commit(const char *file, const char *index, json_t *key) {
    char sidecar[PATH_MAX + 8], tmp[PATH_MAX + 16];
    if (!put_sizes(key, file, index)) {
        del_sizes(key);
        return mt_error_set("%s%s%s: cannot stat: %s", file, index ? " or " : "", index ? index : "",
                            strerror(errno));
    }
    sidecar_of(file, sidecar, sizeof sidecar);
    snprintf(tmp, sizeof tmp, "%s.tmp", sidecar);
    int ok = json_dump_file(key, tmp, JSON_INDENT(2)) == 0 && rename(tmp, sidecar) == 0;
    del_sizes(key);
    if (ok) return MT_OK;
    unlink(tmp);
    return mt_error_set("%s: cannot write: %s", sidecar, strerror(errno));
}

static int load_model_tokenizer(mt_tokenizer **tok, const char *tok_json, const mt_config *cfg) {
    MT_TRY(mt_tokenizer_load(tok, tok_json));
    int vocab = mt_tokenizer_vocab_size(*tok);
    if (vocab <= cfg->V) return MT_OK;
    mt_tokenizer_free(*tok);
    *tok = NULL;
    return mt_error_set("%s: the tokenizer has %d ids but the model's vocabulary (vocab_size) is %d", tok_json,
                        vocab, cfg->V);
}

/* ---- text -> token file ---- */

static int text_cached(mt_token_file *f, const char *path, const char *cache, const char *index,
                       const char *tok_json, const mt_run_data_opts *o, const mt_config *cfg) {
    int elem_size = mt_tokens_elem_size_for_vocab(cfg->V);
    json_t *key = json_pack("{s:s, s:o, s:o, s:o, s:i, s:i, s:b}", "kind", "tokens", "source", file_id(path),
                            "tokenizer", file_id(tok_json), "doc_sep",
                            o->doc_sep ? json_string(o->doc_sep) : json_null(), "elem_size", elem_size,
                            "model_vocab", cfg->V, "add_special", 1);
    int rc = MT_OK;
    if (derived_fresh(cache, index, key)) {
        printf("%s: using the tokenized cache %s\n", path, cache);
    } else {
        mt_tokenizer *tok = NULL;
        rc = load_model_tokenizer(&tok, tok_json, cfg);
        mt_text_stats s;
        if (rc == MT_OK) {
            derived_forget(cache);
            mt_text_opts to = mt_text_opts_default();
            to.doc_sep = o->doc_sep;
            to.elem_size = elem_size;
            to.progress = mt_text_progress_stderr;
            to.doc_index = index;
            rc = mt_text_to_tokens(tok, &path, 1, cache, &to, &s);
            mt_text_stats_report(&s, "megatrain: warning: ", stderr);
        }
        mt_tokenizer_free(tok);
        if (rc == MT_OK) {
            printf("%s: %lld tokens from %lld documents (%s, %.0f tokens/s) -> %s\n", path, (long long)s.tokens,
                   (long long)s.documents, tok_json, s.seconds > 0 ? s.tokens / s.seconds : 0.0, cache);
            rc = derived_commit(cache, index, key);
        }
    }
    json_decref(key);
    return rc == MT_OK ? mt_tokens_open(f, cache, elem_size, cfg->V) : MT_ERR;
}

static int bytes_to_tokens(mt_token_file *f, const char *path, const char *cache, const char *index,
                           const mt_run_data_opts *o, const mt_config *cfg) {
    if (cfg->V <= BYTE_EOS)
        return mt_error_set("%s: text data needs a tokenizer; this model's vocabulary (%d) is too small "
                            "for byte-level tokens (257) and %s has no tokenizer.json; give a token file "
                            "(.bin)", path, cfg->V, o->model_dir ? o->model_dir : "--init");
    derived_forget(cache); /* the byte-level file replaces any tokenizer cache of the same name */
    const char *paths[1] = {path};
    mt_text_stats s;
    /* = tokenize --bytes, and the document index */
    int rc = mt_byte_text_to_tokens_indexed(paths, 1, cache, o->doc_sep, BYTE_EOS, index, &s);
    mt_text_stats_report(&s, "megatrain: warning: ", stderr);
    MT_TRY(rc);
    printf("%s: %lld byte-level tokens -> %s\n", path, (long long)s.tokens, cache);
    return mt_tokens_open(f, cache, 2, cfg->V);
}

/* ---- chat JSONL -> packed rows ---- */

static int chat_cached(mt_packed_file *f, const char *path, const char *packed, const char *tok_json,
                       const mt_run_data_opts *o, const mt_config *cfg) {
    mt_tokenizer *tok = NULL;
    MT_TRY(load_model_tokenizer(&tok, tok_json, cfg)); /* also to know the format AUTO stands for */
    mt_chat_pack_opts po = {.format = o->chat_format, .loss_on = o->loss_on, .T = o->T,
                            .long_policy = o->long_policy, .pack = o->pack, .progress = mt_chat_progress_stderr};
    if (po.format == MT_CHAT_AUTO) po.format = mt_chat_format_for(tok);
    char dir[PATH_MAX], cfg_json[PATH_MAX + 32], jinja[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s", tok_json);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    snprintf(cfg_json, sizeof cfg_json, "%s/tokenizer_config.json", dir);
    snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir);
    json_t *key = json_pack("{s:s, s:i, s:o, s:o, s:o, s:o, s:s, s:s, s:s, s:s, s:i, s:i}", "kind", "packed",
                            "version", MT_PACKED_VERSION, "source", file_id(path), "tokenizer", file_id(tok_json),
                            "tokenizer_config", file_id(cfg_json), "chat_template", file_id(jinja), "format",
                            mt_chat_format_name(po.format), "loss_on",
                            o->loss_on == MT_CHAT_LOSS_ALL ? "all" : "assistant", "long",
                            mt_long_policy_name(o->long_policy), "pack", mt_pack_policy_name(o->pack), "seq", o->T,
                            "model_vocab", cfg->V);
    int rc = MT_OK;
    if (derived_fresh(packed, NULL, key)) {
        printf("%s: using the packed cache %s\n", path, packed);
    } else {
        derived_forget(packed);
        mt_chat_pack_stats s;
        rc = mt_chat_pack(tok, &path, 1, packed, &po, &s);
        mt_chat_pack_report(&s, "megatrain: warning: ", stderr);
        if (rc == MT_OK) {
            mt_chat_pack_summary(&s, &po, path, packed, stdout);
            rc = derived_commit(packed, NULL, key);
        }
    }
    json_decref(key);
    mt_tokenizer_free(tok);
    return rc == MT_OK ? mt_packed_open(f, packed, o->T, cfg->V) : MT_ERR;
}

/* ---- dispatch ---- */

static int refuse_chat_flags(const char *path, const char *what) {
    return mt_error_set("--loss-on / --chat-format / --long / --pack apply to chat JSONL (a \"messages\" field); "
                        "%s is %s", path, what);
}

static const char *file_kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

int mt_run_data_check_file(const char *flag, const char *path) {
    const char *f = flag ? flag : "", *sp = flag ? " " : "";
    struct stat st;
    /* stat, never open, first: opening a FIFO that has no writer blocks until one comes */
    if (stat(path, &st) != 0) return mt_error_set("%s%s%s: cannot open: %s", f, sp, path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return mt_error_set("%s%s%s: is %s, not a regular file", f, sp, path, file_kind(st.st_mode));
    FILE *fp = fopen(path, "rb"); /* a regular file: does not block */
    if (!fp) return mt_error_set("%s%s%s: cannot open: %s", f, sp, path, strerror(errno));
    fclose(fp);
    return MT_OK;
}

int mt_run_data_open(mt_run_data *d, const char *path, const mt_run_data_opts *o, const mt_config *cfg) {
    memset(d, 0, sizeof *d);
    mt_map_guard_install(); /* every command that reads data from here on reads mappings */
    MT_TRY(mt_run_data_check_file(NULL, path));
    size_t len = strlen(path);
    if (mt_packed_is_packed(path) || (len > 7 && !strcmp(path + len - 7, ".packed"))) {
        if (o->chat_flags) return refuse_chat_flags(path, "already packed");
        return mt_packed_open(&d->packed, path, o->T, cfg->V);
    }
    int chat = mt_text_is_jsonl(path) && mt_chat_jsonl_detect(path);
    if (o->chat_flags && !chat) return refuse_chat_flags(path, "not chat data");
    if (is_token_file(path)) return mt_tokens_open(&d->tokens, path, mt_tokens_elem_size_for_vocab(cfg->V), cfg->V);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char derived[PATH_MAX], tok_json[PATH_MAX] = "";
    if (snprintf(derived, sizeof derived, "%s/%s.%s", o->out_dir, base, chat ? "packed" : "tokens.bin") >=
        (int)sizeof derived)
        return mt_error_set("%s: path too long", o->out_dir);
    if (o->model_dir) snprintf(tok_json, sizeof tok_json, "%s/tokenizer.json", o->model_dir);
    int have_tok = o->model_dir && access(tok_json, F_OK) == 0;
    if (chat && !have_tok)
        return mt_error_set("%s: chat data (\"messages\") is rendered with the model's tokenizer.json, and %s has "
                            "none", path, o->model_dir ? o->model_dir : "--init");
    if (chat) return chat_cached(&d->packed, path, derived, tok_json, o, cfg);
    char index[PATH_MAX + 8];
    snprintf(index, sizeof index, "%s.docs", derived);
    int rc = have_tok ? text_cached(&d->tokens, path, derived, index, tok_json, o, cfg)
                      : bytes_to_tokens(&d->tokens, path, derived, index, o, cfg);
    if (rc != MT_OK) return rc;
    d->doc_index = strdup(index);
    MT_CHECK(d->doc_index, "out of memory");
    d->one_doc_per_file = !o->doc_sep && !mt_text_is_jsonl(path);
    return MT_OK;
}

/* Text data: whole documents on each side (data/doc_split.h). */
static int split_documents(mt_run_data *d, const char *name, double fraction, uint64_t seed) {
    char what[PATH_MAX + 96];
    int64_t *ends, n;
    MT_TRY(mt_doc_index_load(d->doc_index, &d->tokens, &ends, &n));
    snprintf(what, sizeof what, "%s (%lld document%s%s)", name, (long long)n, n == 1 ? "" : "s",
             d->one_doc_per_file ? ": without --doc-sep a text file is one" : "");
    int rc = mt_data_split_make(&d->split, n, fraction, seed, what);
    if (rc == MT_OK) {
        mt_doc_stream_make(&d->train_docs, ends, d->split.train, d->split.n_train);
        mt_doc_stream_make(&d->eval_docs, ends, d->split.eval, d->split.n_eval);
    }
    free(ends);
    return rc;
}

int mt_run_data_split(mt_run_data *d, const char *name, double fraction, uint64_t seed, int T) {
    char what[PATH_MAX + 96];
    int64_t units;
    if (d->doc_index) return split_documents(d, name, fraction, seed);
    if (d->packed.data) {
        units = d->packed.rows;
        snprintf(what, sizeof what, "%s (%lld packed rows)", name, (long long)units);
    } else {
        MT_CHECK(T > 0, "T %d", T);
        units = d->tokens.n_tokens / T > 1 ? d->tokens.n_tokens / T : 1;
        snprintf(what, sizeof what, "%s (%lld tokens: %lld sequences of --seq %d)", name,
                 (long long)d->tokens.n_tokens, (long long)units, T);
    }
    return mt_data_split_make(&d->split, units, fraction, seed, what);
}

const char *mt_run_data_split_units(const mt_run_data *d) {
    return d->packed.data ? "rows" : d->doc_index ? "documents" : "sequences";
}

void mt_run_data_close(mt_run_data *d) {
    mt_data_split_free(&d->split);
    mt_doc_stream_free(&d->train_docs);
    mt_doc_stream_free(&d->eval_docs);
    free(d->doc_index);
    mt_tokens_close(&d->tokens);
    mt_packed_close(&d->packed);
    free(d->doc_start);
    memset(d, 0, sizeof *d);
}

void mt_run_data_describe(const mt_run_data *d, char *buf, int size) {
    if (d->packed.data)
        snprintf(buf, size, "%lld packed rows of %d tokens, %lld conversations, %lld trained targets",
                 (long long)d->packed.rows, d->packed.T, (long long)d->packed.documents, (long long)d->packed.trained);
    else snprintf(buf, size, "%lld tokens", (long long)d->tokens.n_tokens);
}

static int32_t *doc_buffer(mt_run_data *d, int n) {
    if (d->doc_cap < n) {
        free(d->doc_start);
        d->doc_start = mt_malloc((size_t)n * sizeof(int32_t));
        d->doc_cap = n;
    }
    return d->doc_start;
}

/* A data file that shrank under the run ends the command here, before the batch is read: the batch
 * API has no error path (the step loops cannot fail at this point), and what was saved so far is
 * complete on disk (checkpoints are renamed into place whole), so only the steps since are lost. */
static void data_still_whole(const mt_run_data *d) {
    if (mt_map_guard_check(d->packed.data ? (const void *)d->packed.data : (const void *)d->tokens.data) == MT_OK)
        return;
    fflush(stdout);
    fprintf(stderr, "megatrain: %s\n", mt_error_message());
    exit(1);
}

/* B rows of a split: training rows of `step` (o != NULL), or eval rows from first_row (past the
 * held-out units: padding, inputs 0 and targets -1, as the eval batches without a split). Text data
 * reads each side's documents as a stream (data/doc_split.h). */
static const int32_t *split_rows(mt_run_data *d, const mt_batch_order *o, int64_t step, int64_t first_row, int B,
                                 int T, int32_t *inputs, int32_t *targets) {
    const mt_data_split *s = &d->split;
    if (d->packed.data) MT_CHECK(T == d->packed.T, "T %d, packed rows of %d", T, d->packed.T);
    int32_t *ds = d->packed.data ? doc_buffer(d, B * T) : NULL;
    for (int r = 0; r < B; r++) {
        size_t off = (size_t)r * T;
        if (d->doc_index && o) {
            mt_doc_stream_train_row(&d->train_docs, &d->tokens, o, step * (int64_t)B + r, T, inputs + off,
                                    targets + off);
            continue;
        }
        if (d->doc_index) {
            mt_doc_stream_eval_row(&d->eval_docs, &d->tokens, first_row + r, T, inputs + off, targets + off);
            continue;
        }
        int64_t unit = -1;
        if (o) unit = mt_data_split_train_unit(s, o, step * (int64_t)B + r);
        else if (first_row + r < s->n_eval) unit = s->eval[first_row + r];
        if (unit < 0) {
            for (int t = 0; t < T; t++) inputs[off + t] = 0, targets[off + t] = -1;
            if (ds) memset(ds + off, 0, (size_t)T * sizeof(int32_t));
        } else if (ds) {
            mt_packed_row(&d->packed, unit, inputs + off, targets + off, ds + off);
        } else {
            mt_tokens_window(&d->tokens, unit, T, inputs + off, targets + off);
        }
    }
    return ds;
}

const int32_t *mt_run_data_batch(mt_run_data *d, const mt_batch_order *o, int64_t step, int B, int T,
                                 int32_t *inputs, int32_t *targets) {
    data_still_whole(d);
    if (d->split.units) return split_rows(d, o, step, 0, B, T, inputs, targets);
    if (!d->packed.data) {
        mt_tokens_batch(&d->tokens, o, step, B, T, inputs, targets);
        return NULL;
    }
    MT_CHECK(T == d->packed.T, "T %d, packed rows of %d", T, d->packed.T);
    int32_t *ds = doc_buffer(d, B * T);
    mt_packed_batch(&d->packed, o, step, B, inputs, targets, ds);
    return ds;
}

int64_t mt_run_data_eval_rows(const mt_run_data *d, int T) {
    if (d->split.units) return d->doc_index ? mt_doc_stream_eval_rows(&d->eval_docs, T) : d->split.n_eval;
    return d->packed.data ? d->packed.rows : mt_tokens_eval_rows(&d->tokens, T);
}

const int32_t *mt_run_data_eval_batch(mt_run_data *d, int64_t first_row, int B, int T, int32_t *inputs,
                                      int32_t *targets) {
    data_still_whole(d);
    if (d->split.units) return split_rows(d, NULL, 0, first_row, B, T, inputs, targets);
    if (!d->packed.data) {
        mt_tokens_eval_batch(&d->tokens, first_row, B, T, inputs, targets);
        return NULL;
    }
    MT_CHECK(T == d->packed.T, "T %d, packed rows of %d", T, d->packed.T);
    int32_t *ds = doc_buffer(d, B * T);
    mt_packed_eval_batch(&d->packed, first_row, B, inputs, targets, ds);
    return ds;
}
