/* Loading training checkpoints: the newest, one directory verified whole, and resuming from the
 * newest intact one (checkpoint.h). */
#include "io/checkpoint.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "io/digest.h"
#include "io/hf_layout.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/lora.h"

/* ---- latest ---- */

int mt_checkpoint_latest(const char *out_dir, char *path, size_t path_size) {
    char *ckdir = ckpt_path_join(out_dir, CKPT_SUBDIR);
    int err;
    ckpt_step_list l = ckpt_list_steps(ckdir, &err);
    int rc;
    if (err && err != ENOENT)
        rc = mt_error_set("%s: cannot list checkpoints: %s", ckdir, strerror(err));
    else if (l.n == 0)
        rc = mt_error_set("%s: no checkpoint to resume from (no %s/" STEP_PREFIX "* directory)",
                          out_dir, ckdir);
    else {
        char name[64];
        ckpt_step_name(name, sizeof name, "", l.steps[0]);
        int k = snprintf(path, path_size, "%s/%s", ckdir, name);
        rc = k >= 0 && (size_t)k < path_size
                 ? MT_OK
                 : mt_error_set("%s/%s: path longer than %zu bytes", ckdir, name, path_size);
    }
    free(l.steps);
    free(ckdir);
    return rc;
}

/* ---- load ---- */

/* Every field that shapes the parameter table must agree; others only warn. */
static int check_config(const mt_config *disk, const mt_config *run, const char *path) {
    if (disk->arch != run->arch)
        return mt_error_set("%s: model_type is %s, the run's model is %s; this checkpoint belongs "
                            "to a different model", path, disk->model_type, run->model_type);
    struct {
        const char *field;
        int disk, run;
    } f[] = {
        {"hidden_size", disk->C, run->C},
        {"intermediate_size", disk->F, run->F},
        {"num_hidden_layers", disk->L, run->L},
        {"num_attention_heads", disk->H, run->H},
        {"num_key_value_heads", disk->G, run->G},
        {"head_dim", disk->D, run->D},
        {"vocab_size", disk->V, run->V},
        {"tie_word_embeddings", disk->tie_word_embeddings, run->tie_word_embeddings},
        {"attention_bias (q/k/v)", disk->qkv_bias, run->qkv_bias},
        {"attention_bias (o_proj)", disk->o_bias, run->o_bias},
        {"mlp_bias", disk->mlp_bias, run->mlp_bias},
        {"qk_norm", disk->qk_norm, run->qk_norm},
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (f[i].disk != f[i].run)
            return mt_error_set("%s: %s is %d, the run's model has %d; this checkpoint belongs to "
                                "a different model", path, f[i].field, f[i].disk, f[i].run);
    if (disk->rms_norm_eps != run->rms_norm_eps || disk->rope_theta != run->rope_theta ||
        disk->rope_type != run->rope_type)
        fprintf(stderr, "megatrain: warning: %s: rms_norm_eps or rope settings differ from the "
                "run's config; the run's values are used\n", path);
    return MT_OK;
}

/* The inverse of seed_json: an integer >= 0, or a string of decimal digits up to 2^64 - 1. */
static int parse_seed(const json_t *v, uint64_t *out) {
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = (uint64_t)json_integer_value(v);
        return MT_OK;
    }
    const char *digits = json_string_value(v);
    size_t n = digits ? strlen(digits) : 0;
    if (n == 0 || n > 20 || strspn(digits, "0123456789") != n) return MT_ERR;
    errno = 0;
    unsigned long long x = strtoull(digits, NULL, 10);
    if (errno) return MT_ERR;
    *out = x;
    return MT_OK;
}

/* A file name trainer_state.json may list: plain, inside the checkpoint directory. */
static int plain_file_name(const char *s) {
    return *s && strlen(s) < sizeof((ckpt_file_entry *)0)->name && !strchr(s, '/') &&
           strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && strcmp(s, "trainer_state.json") != 0;
}

/* "files": {NAME: {"bytes": N, "xxh3_64": "16 hex"}, ...} -> l; a LoRA checkpoint's required
 * files are its three. */
static int read_files(const char *path, const json_t *fo, int lora, ckpt_file_list *l) {
    if (!json_is_object(fo))
        return mt_error_set("%s: \"files\" must be an object of file checksums (format >= 2)", path);
    const char *name;
    json_t *v;
    l->n = 0;
    json_object_foreach((json_t *)fo, name, v) {
        json_t *bytes = json_object_get(v, "bytes");
        mt_file_digest d;
        if (!plain_file_name(name) || l->n == MAX_FILES)
            return mt_error_set("%s: \"files\": \"%s\" is not a checkpoint file name", path, name);
        if (!json_is_integer(bytes) || json_integer_value(bytes) < 0 ||
            mt_digest_parse_hex(json_string_value(json_object_get(v, "xxh3_64")), &d.xxh3) != MT_OK)
            return mt_error_set("%s: \"files\": \"%s\" needs \"bytes\" (an integer >= 0) and "
                                "\"xxh3_64\" (16 hex digits)", path, name);
        d.bytes = (uint64_t)json_integer_value(bytes);
        ckpt_add_file(l, name, &d);
    }
    static const char *const full_files[] = {"config.json", "model.safetensors",
                                             "optimizer.safetensors"};
    static const char *const lora_files[] = {CKPT_LORA_CONFIG, CKPT_LORA_WEIGHTS, CKPT_LORA_OPTIM};
    const char *const *required = lora ? lora_files : full_files;
    for (size_t r = 0; r < 3; r++) {
        int found = 0;
        for (int k = 0; k < l->n; k++) found |= strcmp(l->e[k].name, required[r]) == 0;
        if (!found)
            return mt_error_set("%s: \"files\" has no checksum of %s", path, required[r]);
    }
    return MT_OK;
}

/* The step a directory's name says (.../step_00000038 -> 38), or -1 for another name. */
static int64_t dir_step(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    char name[64];
    if (n - b >= sizeof name) return -1;
    memcpy(name, dir + b, n - b);
    name[n - b] = '\0';
    return ckpt_parse_step_name(name);
}

/* "lora": {"r": R, "lora_alpha": A, "target_modules": "NAME,..."} -> *out. */
static int read_lora(const char *path, const json_t *lo, ckpt_lora_info *out) {
    json_t *r = json_object_get(lo, "r"), *alpha = json_object_get(lo, "lora_alpha");
    const char *targets = json_string_value(json_object_get(lo, "target_modules"));
    if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > MT_LORA_MAX_RANK ||
        !json_is_number(alpha) || !(json_number_value(alpha) > 0) || !targets || !*targets ||
        strlen(targets) >= sizeof out->targets)
        return mt_error_set("%s: \"lora\" must be {\"r\": 1 to %d, \"lora_alpha\": a number > 0, "
                            "\"target_modules\": \"NAME,...\"}", path, MT_LORA_MAX_RANK);
    out->r = (int)json_integer_value(r);
    out->alpha = json_number_value(alpha);
    snprintf(out->targets, sizeof out->targets, "%s", targets);
    return MT_OK;
}

/* trainer_state.json -> *out, *format, (format >= 2) the recorded files and (with "lora") *lora. */
static int read_state(const char *path, int64_t dir_step_num, mt_ckpt_state *out, int *format,
                      ckpt_file_list *files, ckpt_lora_info *lora) {
    if (access(path, R_OK) != 0) return mt_error_set("%s: cannot open: %s", path, strerror(errno));
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return mt_error_set("%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    int rc = MT_OK;
    json_t *fmt = json_object_get(o, "format"), *step = json_object_get(o, "step");
    json_t *seed = json_object_get(o, "seed"), *loss = json_object_get(o, "loss");
    json_t *updates = json_object_get(o, "updates"), *skipped = json_object_get(o, "skipped");
    json_t *in_a_row = json_object_get(o, "nonfinite_in_a_row");
    json_t *args = json_object_get(o, "args");
    json_t *state = json_object_get(o, "state"), *sr_seed = json_object_get(o, "sr_seed");
    mt_ckpt_state s = {0, 0, NAN, 0, 0, NULL, MT_STATE_FULL, 0, 0};
    files->n = 0;
    if (!json_is_integer(fmt) || json_integer_value(fmt) < 1 ||
        json_integer_value(fmt) > MT_CKPT_FORMAT)
        rc = mt_error_set("%s: \"format\" must be 1 to %d (a checkpoint of a newer version?)",
                          path, MT_CKPT_FORMAT);
    else if (!json_is_integer(step) || json_integer_value(step) < 0)
        rc = mt_error_set("%s: \"step\" must be an integer >= 0", path);
    else {
        *format = (int)json_integer_value(fmt);
        s.step = json_integer_value(step);
        if (dir_step_num >= 0 && s.step != dir_step_num)
            rc = mt_error_set("%s: \"step\" is %lld but the directory is step %lld's (a checkpoint "
                              "copied or renamed by hand?)", path, (long long)s.step,
                              (long long)dir_step_num);
        else if (parse_seed(seed, &s.seed) != MT_OK)
            rc = mt_error_set("%s: \"seed\" must be an integer >= 0", path);
    }
    if (rc == MT_OK) {
        if (json_is_number(loss)) s.loss = json_number_value(loss);
        else if (!json_is_null(loss))
            rc = mt_error_set("%s: \"loss\" must be a number or null", path);
    }
    if (rc == MT_OK) { /* absent in older checkpoints: every step was an update */
        s.updates = updates ? json_integer_value(updates) : s.step;
        s.skipped = skipped ? json_integer_value(skipped) : 0;
        if ((updates && !json_is_integer(updates)) || (skipped && !json_is_integer(skipped)) ||
            s.updates < 0 || s.skipped < 0 || s.updates > s.step || s.skipped > s.step)
            rc = mt_error_set("%s: \"updates\" and \"skipped\" must be integers from 0 to \"step\"", path);
    }
    if (rc == MT_OK && in_a_row) { /* absent before it was recorded: 0 */
        s.in_a_row = json_integer_value(in_a_row);
        if (!json_is_integer(in_a_row) || s.in_a_row < 0 || s.in_a_row > s.skipped)
            rc = mt_error_set("%s: \"nonfinite_in_a_row\" must be an integer from 0 to \"skipped\"", path);
    }
    if (rc == MT_OK && state) { /* absent before format 3: full */
        const char *name = json_string_value(state);
        if (!name || mt_state_format_parse(name, &s.state) != MT_OK)
            rc = mt_error_set("%s: \"state\" must be \"full\", \"compact\" or \"tight\"", path);
    }
    if (rc == MT_OK && s.state == MT_STATE_TIGHT && parse_seed(sr_seed, &s.sr_seed) != MT_OK)
        rc = mt_error_set("%s: \"sr_seed\" (tight's rounding seed) must be the decimal digits of "
                          "an integer from 0 to 2^64 - 1", path);
    json_t *lo = json_object_get(o, "lora");
    s.lora = lo != NULL;
    if (rc == MT_OK && lo) { /* written since format 3, its moments full */
        if (*format < 3 || s.state != MT_STATE_FULL)
            rc = mt_error_set("%s: a LoRA checkpoint (\"lora\") must be format 3 with \"state\": "
                              "\"full\"", path);
        else rc = read_lora(path, lo, lora);
    }
    if (rc == MT_OK && *format >= 2) rc = read_files(path, json_object_get(o, "files"), s.lora, files);
    if (rc == MT_OK && args && !json_is_null(args))
        s.args_json = json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    json_decref(o);
    if (rc == MT_OK) *out = s;
    return rc;
}

/* Every recorded file has its recorded length and XXH3-64; files hashed in parallel (a 7B
 * checkpoint is ~100 GB), the first failure in list order reported. */
int ckpt_verify_files(const char *dir, const ckpt_file_list *l) {
    int err[MAX_FILES];
    mt_file_digest got[MAX_FILES];
#pragma omp parallel for schedule(dynamic, 1) if (l->n > 1)
    for (int i = 0; i < l->n; i++) {
        char *p = ckpt_path_join(dir, l->e[i].name);
        err[i] = mt_digest_file(p, &got[i]);
        free(p);
    }
    for (int i = 0; i < l->n; i++) {
        const mt_file_digest *want = &l->e[i].d;
        const char *name = l->e[i].name;
        if (err[i])
            return mt_error_set("%s/%s: cannot read to verify its checksum: %s", dir, name,
                                strerror(err[i]));
        if (got[i].bytes != want->bytes)
            return mt_error_set("%s/%s: checksum mismatch: %llu bytes, trainer_state.json records "
                                "%llu (the file is truncated, damaged or was replaced)", dir, name,
                                (unsigned long long)got[i].bytes,
                                (unsigned long long)want->bytes);
        if (got[i].xxh3 != want->xxh3) {
            char a[MT_DIGEST_HEX], b[MT_DIGEST_HEX];
            mt_digest_hex(got[i].xxh3, a);
            mt_digest_hex(want->xxh3, b);
            return mt_error_set("%s/%s: checksum mismatch: xxh3_64 %s, trainer_state.json records "
                                "%s (the file is damaged or was replaced)", dir, name, a, b);
        }
    }
    return MT_OK;
}

/* A training checkpoint holds the fp32 master; an exported (converted) model in its place is
 * refused with what happened, before the checksum (which would only say "replaced"). */
static int check_weights_f32(const mt_safetensors *mst, const char *ckpt_dir, const mt_param_table *t) {
    for (int i = 0; i < mt_safetensors_count(mst); i++) {
        const mt_st_tensor *x = mt_safetensors_at(mst, i);
        if (x->dtype == MT_F32) continue;
        /* a multimodal model's carried tensors keep their dtypes: only the language model's count */
        if (t->cfg.nested && strncmp(x->name, MT_HF_LM_PREFIX, strlen(MT_HF_LM_PREFIX)) != 0 &&
            strcmp(x->name, "lm_head.weight") != 0)
            continue;
        char dt[16];
        snprintf(dt, sizeof dt, "%s", mt_dtype_name(x->dtype));
        for (char *c = dt; *c; c++) *c = (char)tolower((unsigned char)*c);
        return mt_error_set("%s holds %s weights: an exported model, not a training checkpoint "
                            "(the fp32 master is gone); fine-tune from it with --model %s instead "
                            "of --resume", mt_safetensors_source(mst), dt, ckpt_dir);
    }
    return MT_OK;
}

static int same_shape(const mt_st_tensor *x, int ndim, const int64_t *shape) {
    int same = x->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = x->shape[d] == shape[d];
    return same;
}

/* The weights (all F32 by now, so no MXFP4 pair: check_weights_f32 refused its U8 halves): every
 * tensor of the table with its shape, found as mt_model_load finds them (io/hf_layout.h: a nested
 * model's prefix, fused experts, the carried tensors), nothing else but what mt_model_load also
 * passes over. */
static int check_model(const mt_safetensors *mst, const mt_param_table *t, mt_hf_ref *refs) {
    return mt_hf_resolve(t, mst, refs, NULL);
}

/* The optimizer file holds exactly the parts of format b->f of every tensor, with their dtypes
 * and shapes. */
static int check_optimizer(const mt_safetensors *ost, const char *path, const mt_param_table *t,
                           ckpt_tensor_buf *b) {
    int want = 0;
    char name[CKPT_PART_NAME], parts[128] = "";
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        ckpt_buf_layout(b, p);
        for (int k = 0; k < b->n_parts; k++, want++) {
            const mt_optim_tensor *part = &b->part[k];
            ckpt_part_name(name, sizeof name, part, p);
            const mt_st_tensor *x = mt_safetensors_find(ost, name);
            if (!x) return mt_error_set("%s: tensor %s is missing", path, name);
            if (x->dtype != part->dtype)
                return mt_error_set("%s: tensor %s: dtype %s, %s optimizer state stores %s", path,
                                    name, mt_dtype_name(x->dtype), mt_state_format_name(b->f),
                                    mt_dtype_name(part->dtype));
            int64_t shape[3]; /* a conv1d weight has 3 dims */
            int ndim = ckpt_part_shape(part, p, shape);
            if (!same_shape(x, ndim, shape))
                return mt_error_set("%s: tensor %s: shape differs from the model's", path, name);
            if (i == 0) /* the part names, for the message below */
                snprintf(parts + strlen(parts), sizeof parts - strlen(parts), "%s%s",
                         k ? "/" : "", part->name);
        }
    }
    if (mt_safetensors_count(ost) != want)
        return mt_error_set("%s: %d tensors, the model's %s optimizer state has %d (tensors that "
                            "are not %s of this model)", path, mt_safetensors_count(ost),
                            mt_state_format_name(b->f), want, parts);
    return MT_OK;
}

ckpt_value_bound ckpt_bound_of(const char *part) {
    const float m = MT_CKPT_MAX_MOMENT;
    if (strcmp(part, "weight") == 0)
        return (ckpt_value_bound){MT_CKPT_MAX_WEIGHT, 0, "|w| <= 1e8 (trained weights stay within "
                                                         "the hundreds)"};
    if (strcmp(part, "exp_avg") == 0)
        return (ckpt_value_bound){m, 0, "|exp_avg| <= 1e8 (Adam's first moment: an average of gradients)"};
    if (strcmp(part, "exp_avg_scale") == 0)
        return (ckpt_value_bound){m, 1, "0 <= exp_avg_scale <= 1e8 (a block's largest |exp_avg|)"};
    if (strcmp(part, "exp_avg_sq") == 0)
        return (ckpt_value_bound){m * m, 1, "0 <= exp_avg_sq <= 1e16 (Adam's second moment: an average of "
                                            "squared gradients)"};
    if (strcmp(part, "exp_avg_sq_scale") == 0)
        return (ckpt_value_bound){m * m, 1, "0 <= exp_avg_sq_scale <= 1e16 (a block's largest exp_avg_sq)"};
    return (ckpt_value_bound){m, 0, "|x| <= 1e8"};
}

int ckpt_check_values(const char *file, const char *name, const void *x, int64_t n, ckpt_value_bound b) {
    int64_t i = ckpt_first_out_of_range(x, n, b.max_abs, b.nonneg);
    if (i < 0) return MT_OK;
    float v;
    memcpy(&v, (const unsigned char *)x + 4 * i, 4);
    if (!isfinite(v))
        return mt_error_set("%s: tensor %s holds NaN or inf; a checkpoint must be finite (this one "
                            "is damaged)", file, name);
    return mt_error_set("%s: tensor %s: element %lld is %g, outside %s: a finite but absurd value "
                        "(this checkpoint is damaged)", file, name, (long long)i, (double)v, b.what);
}

/* Every weight and every fp32 part (moments, scales) finite and within its bound. U8 codes decode
 * to [-1, 1] x scale: bounding the scale bounds them. */
static int check_sane(const mt_hf_ref *refs, const mt_safetensors *ost, const mt_param_table *t,
                      ckpt_tensor_buf *b) {
    char name[CKPT_PART_NAME];
    ckpt_value_bound w = ckpt_bound_of("weight");
    for (int i = 0; i < t->n_params; i++) {
        mt_st_tensor x = mt_hf_ref_view(&refs[i], t->params[i].numel);
        mt_hf_name(t, &t->params[i], name, sizeof name);
        MT_TRY(ckpt_check_values(x.path, name, x.data, x.numel, w));
    }
    for (int i = 0; i < t->n_params; i++) {
        ckpt_buf_layout(b, &t->params[i]);
        for (int k = 0; k < b->n_parts; k++) {
            if (b->part[k].dtype != MT_F32) continue;
            ckpt_part_name(name, sizeof name, &b->part[k], &t->params[i]);
            const mt_st_tensor *x = mt_safetensors_find(ost, name);
            MT_TRY(ckpt_check_values(x->path, name, x->data, x->numel, ckpt_bound_of(b->part[k].name)));
        }
    }
    return MT_OK;
}

/* The validated tensors into the state, one at a time through b (the mapping's bytes may be
 * unaligned; io gets aligned buffers). */
static int apply(const mt_hf_ref *refs, const mt_safetensors *ost, const mt_param_table *t,
                 const mt_state_io *io, ckpt_tensor_buf *b) {
    char name[CKPT_PART_NAME];
    for (int i = 0; i < t->n_params; i++) {
        const mt_param *p = &t->params[i];
        mt_st_tensor v = mt_hf_ref_view(&refs[i], p->numel);
        MT_CHECK(mt_st_tensor_to_f32(&v, b->w) == MT_OK, "%s", mt_error_message());
        MT_TRY(io->set_weights(io->ctx, p, b->w));
        ckpt_buf_layout(b, p);
        for (int k = 0; k < b->n_parts; k++) {
            ckpt_part_name(name, sizeof name, &b->part[k], p);
            const mt_st_tensor *x = mt_safetensors_find(ost, name);
            memcpy(b->part[k].data, x->data, x->nbytes);
        }
        MT_TRY(io->set_parts(io->ctx, p, b->part));
    }
    return MT_OK;
}

int ckpt_read_state(const char *ckpt_dir, mt_ckpt_state *st, int *format, ckpt_file_list *files,
                    ckpt_lora_info *lora) {
    char *path = ckpt_path_join(ckpt_dir, "trainer_state.json");
    ckpt_lora_info unused;
    int rc = read_state(path, dir_step(ckpt_dir), st, format, files, lora ? lora : &unused);
    free(path);
    return rc;
}

int mt_checkpoint_read_state(const char *ckpt_dir, mt_ckpt_state *st) {
    ckpt_file_list files;
    int format;
    return ckpt_read_state(ckpt_dir, st, &format, &files, NULL);
}

void mt_ckpt_state_free(mt_ckpt_state *st) {
    free(st->args_json);
    st->args_json = NULL;
}

/* mt_checkpoint_load; *other_format = 1 when the checkpoint is refused for holding another
 * state format than io's, or for being a LoRA run's (not damage: resume does not fall back past
 * it). */
static int load_dir(const char *ckpt_dir, const mt_param_table *t, const mt_state_io *io,
                    mt_ckpt_state *st, int *other_format) {
    MT_CHECK(io && io->set_weights && io->set_parts && io->format >= MT_STATE_FULL &&
             io->format <= MT_STATE_TIGHT, "checkpoint load: incomplete mt_state_io");
    *other_format = 0;
    if (!ckpt_is_dir(ckpt_dir)) return mt_error_set("%s: no such checkpoint directory", ckpt_dir);
    char *cfg_path = ckpt_path_join(ckpt_dir, "config.json");
    char *state_path = ckpt_path_join(ckpt_dir, "trainer_state.json");
    char *opt_path = ckpt_path_join(ckpt_dir, "optimizer.safetensors");
    mt_config cfg;
    mt_ckpt_state s = {0};
    mt_safetensors *mst = NULL, *ost = NULL;
    ckpt_file_list files;
    int format = 0;
    char open_err[1024] = "";
    ckpt_lora_info lora;
    int rc = read_state(state_path, dir_step(ckpt_dir), &s, &format, &files, &lora);
    if (rc == MT_OK && s.lora) { /* first: its "full" state would be a misleading mismatch */
        rc = mt_error_set("%s: a LoRA checkpoint (an adapter of rank %d): resume it with the same "
                          "--lora flags", ckpt_dir, lora.r);
        *other_format = 1;
    }
    if (rc == MT_OK && s.state != io->format) {
        const char *has = mt_state_format_name(s.state);
        rc = mt_error_set("%s: holds %s optimizer state, this run uses --state %s: resume with "
                          "--state %s (converting between formats is not supported)", ckpt_dir,
                          has, mt_state_format_name(io->format), has);
        *other_format = 1;
    }
    if (rc == MT_OK) { /* an exported model in place of the master: say so first */
        if (mt_safetensors_open_dir(&mst, ckpt_dir) == MT_OK) rc = check_weights_f32(mst, ckpt_dir, t);
        else snprintf(open_err, sizeof open_err, "%s", mt_error_message());
    }
    if (rc == MT_OK && format >= 2) rc = ckpt_verify_files(ckpt_dir, &files);
    if (rc == MT_OK && format < 2)
        fprintf(stderr, "megatrain: warning: %s: a format-%d checkpoint has no checksums; it cannot "
                "be verified\n", ckpt_dir, format);
    if (rc == MT_OK && !mst) rc = mt_error_set("%s", open_err);
    if (rc == MT_OK) rc = mt_config_load(&cfg, cfg_path);
    if (rc == MT_OK) rc = check_config(&cfg, &t->cfg, cfg_path);
    mt_hf_ref *refs = mt_calloc((size_t)t->n_params + 1, sizeof *refs);
    if (rc == MT_OK) rc = check_model(mst, t, refs);
    if (rc == MT_OK) rc = mt_safetensors_open_file(&ost, opt_path);
    ckpt_tensor_buf b;
    ckpt_buf_init(&b, t, io->format);
    if (rc == MT_OK) rc = check_optimizer(ost, opt_path, t, &b);
    if (rc == MT_OK) rc = check_sane(refs, ost, t, &b);
    /* Only now is the state written: a bad checkpoint never leaves it half loaded. */
    if (rc == MT_OK) rc = apply(refs, ost, t, io, &b);
    free(refs);
    if (rc == MT_OK && s.state == MT_STATE_TIGHT && io->set_sr_seed)
        io->set_sr_seed(io->ctx, s.sr_seed);
    if (rc == MT_OK) *st = s;
    else mt_ckpt_state_free(&s);
    ckpt_buf_free(&b);
    mt_safetensors_close(mst);
    mt_safetensors_close(ost);
    free(cfg_path);
    free(state_path);
    free(opt_path);
    return rc;
}

int mt_checkpoint_load(const char *ckpt_dir, const mt_param_table *t, const mt_state_io *io,
                       mt_ckpt_state *st) {
    int other_format;
    return load_dir(ckpt_dir, t, io, st, &other_format);
}

/* ---- resume ---- */

/* MSG without a leading "DIR/" (the warning names DIR already). */
static const char *relative_to(const char *msg, const char *dir) {
    size_t n = strlen(dir);
    return strncmp(msg, dir, n) == 0 && msg[n] == '/' ? msg + n + 1 : msg;
}

int ckpt_resume_newest(const char *out_dir, ckpt_load_fn load, void *ctx, char *path,
                       size_t path_size) {
    char *ckdir = ckpt_path_join(out_dir, CKPT_SUBDIR);
    int err;
    ckpt_step_list l = ckpt_list_steps(ckdir, &err);
    int rc = MT_ERR, found = -1;
    char **why = mt_calloc((size_t)(l.n ? l.n : 1), sizeof *why); /* each damaged one's reason */
    if (err && err != ENOENT)
        mt_error_set("%s: cannot list checkpoints: %s", ckdir, strerror(err));
    else if (l.n == 0) {
        mt_error_set("%s: no checkpoint to resume from (no %s/" STEP_PREFIX "* directory)",
                     out_dir, ckdir);
        rc = MT_CKPT_NONE;
    }
    int too_long = 0, stop = 0;
    for (int i = 0; i < l.n && found < 0 && !too_long && !stop; i++) {
        char name[64];
        ckpt_step_name(name, sizeof name, "", l.steps[i]);
        int k = snprintf(path, path_size, "%s/%s", ckdir, name); /* before the arenas change */
        if (k < 0 || (size_t)k >= path_size) {
            too_long = 1;
            mt_error_set("%s/%s: path longer than %zu bytes", ckdir, name, path_size);
            break;
        }
        if (load(ctx, path, &stop) == MT_OK) found = i;
        else if (!stop) why[i] = mt_strdup(relative_to(mt_error_message(), path));
    }
    if (found >= 0) {
        char name[64];
        ckpt_step_name(name, sizeof name, "", l.steps[found]);
        for (int i = 0; i < found; i++) {
            char bad[64];
            ckpt_step_name(bad, sizeof bad, "", l.steps[i]);
            fprintf(stderr, "megatrain: warning: %s/%s is damaged (%s); resuming from %s instead\n",
                    ckdir, bad, why[i], name);
        }
        rc = MT_OK;
    } else if (l.n > 0 && !too_long && !stop) {
        char name[64];
        ckpt_step_name(name, sizeof name, "", l.steps[0]);
        if (l.n == 1)
            mt_error_set("%s/%s is damaged (%s) and there is no older checkpoint to resume from",
                         ckdir, name, why[0]);
        else
            mt_error_set("%s/%s is damaged (%s), and none of the %d older checkpoints is intact "
                         "either", ckdir, name, why[0], l.n - 1);
    }
    for (int i = 0; i < l.n; i++) free(why[i]);
    free(why);
    free(l.steps);
    free(ckdir);
    return rc;
}

typedef struct {
    const mt_param_table *t;
    const mt_state_io *io;
    mt_ckpt_state *st;
} full_resume;

static int load_full(void *ctx, const char *dir, int *stop) {
    full_resume *c = ctx;
    return load_dir(dir, c->t, c->io, c->st, stop);
}

int mt_checkpoint_resume(const char *out_dir, const mt_param_table *t, const mt_state_io *io,
                         mt_ckpt_state *st, char *path, size_t path_size) {
    full_resume c = {t, io, st};
    return ckpt_resume_newest(out_dir, load_full, &c, path, path_size);
}
