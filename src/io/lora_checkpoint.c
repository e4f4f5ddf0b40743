/* Checkpoints of a LoRA run (io/lora_checkpoint.h): the adapter directory mt_lora_save_dir writes,
 * the moments beside it, trainer_state.json, through the full checkpoint's steps
 * (checkpoint_dir.h: temporary directory, publish and prune, state file, checksums, bounds). */
#include "io/lora_checkpoint.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/checkpoint_dir.h"
#include "io/digest.h"
#include "io/lora_io.h"
#include "io/safetensors.h"

#define LORA_PART_NAME 192 /* "exp_avg_sq." + a PEFT key (< 160) */

/* The three arenas a LoRA checkpoint holds, in file order of each tensor's optimizer parts. */
enum { ARENA_W, ARENA_M, ARENA_V, N_ARENAS };
static const char *const PART[N_ARENAS] = {"weight", "exp_avg", "exp_avg_sq"};

/* The name of arena a's copy of adapter tensor p in its file: the PEFT key itself for the weights
 * (adapter_model.safetensors), "<part>.<PEFT key>" for the moments. */
static void part_name(char *buf, size_t size, int a, const mt_lora_param *p) {
    if (a == ARENA_W) snprintf(buf, size, "%s", p->name);
    else snprintf(buf, size, "%s.%s", PART[a], p->name);
}

/* ---- save ---- */

static int check_finite(const char *out_dir, int64_t step, const mt_lora_table *lt,
                        const float *const arena[N_ARENAS]) {
    for (int i = 0; i < lt->n_params; i++) {
        const mt_lora_param *p = &lt->params[i];
        for (int a = 0; a < N_ARENAS; a++) {
            if (!ckpt_any_nonfinite(arena[a] + p->offset, p->numel)) continue;
            return mt_error_set("%s: checkpoint of step %lld not written: %s NaN or inf in tensor "
                                "%s (the older checkpoints are kept as they are)", out_dir,
                                (long long)step,
                                a == ARENA_W ? "the adapter weights hold" : ckpt_part_what(PART[a]),
                                p->name);
        }
    }
    return MT_OK;
}

/* DIR/NAME's digest into files (a file another writer made: read back once; adapters are small). */
static int add_digest(const char *dir, const char *name, ckpt_file_list *files) {
    char *path = ckpt_path_join(dir, name);
    mt_file_digest d;
    int e = mt_digest_file(path, &d);
    int rc = e ? mt_error_set("%s: cannot read back: %s", path, strerror(e)) : MT_OK;
    if (rc == MT_OK) ckpt_add_file(files, name, &d);
    free(path);
    return rc;
}

/* DIR/adapter_optimizer.safetensors: exp_avg then exp_avg_sq of each tensor, its shape. */
static int save_moments(const char *dir, const mt_lora_table *lt, const float *m, const float *v,
                        ckpt_file_list *files) {
    int n = 2 * lt->n_params;
    mt_st_write_tensor *w = mt_calloc((size_t)n + 1, sizeof *w);
    char (*names)[LORA_PART_NAME] = mt_calloc((size_t)n + 1, sizeof *names);
    for (int i = 0; i < lt->n_params; i++) {
        const mt_lora_param *p = &lt->params[i];
        for (int k = 0; k < 2; k++) {
            int j = 2 * i + k;
            part_name(names[j], sizeof names[j], ARENA_M + k, p);
            w[j] = (mt_st_write_tensor){.name = names[j], .dtype = MT_F32, .ndim = 2,
                                        .data = (k ? v : m) + p->offset};
            w[j].shape[0] = p->shape[0];
            w[j].shape[1] = p->shape[1];
        }
    }
    const mt_st_meta meta[] = {{"format", "pt"}};
    char *path = ckpt_path_join(dir, CKPT_LORA_OPTIM);
    mt_file_digest d;
    int rc = mt_safetensors_write_digest(path, w, n, meta, 1, &d);
    if (rc == MT_OK) ckpt_add_file(files, CKPT_LORA_OPTIM, &d);
    free(path);
    free(names);
    free(w);
    return rc;
}

/* trainer_state.json's "lora": lora_alpha an integer when it is one, as adapter_config.json. */
static json_t *lora_json(const mt_lora_table *lt) {
    json_t *o = json_object();
    json_object_set_new(o, "r", json_integer(lt->rank));
    if (lt->alpha == (double)(json_int_t)lt->alpha)
        json_object_set_new(o, "lora_alpha", json_integer((json_int_t)lt->alpha));
    else
        json_object_set_new(o, "lora_alpha", json_real(lt->alpha));
    json_object_set_new(o, "target_modules", json_string(lt->targets));
    return o;
}

static int save_contents(const char *dir, const mt_lora_table *lt, const float *const arena[N_ARENAS],
                         const mt_ckpt_state *st, json_t *args, const char *base_model) {
    ckpt_file_list files = {.n = 0};
    int rc = mt_lora_save_dir(lt, arena[ARENA_W], dir, base_model, MT_F32);
    if (rc == MT_OK) rc = add_digest(dir, CKPT_LORA_CONFIG, &files);
    if (rc == MT_OK) rc = add_digest(dir, CKPT_LORA_WEIGHTS, &files);
    if (rc == MT_OK) rc = save_moments(dir, lt, arena[ARENA_M], arena[ARENA_V], &files);
    if (rc != MT_OK) return rc;
    const mt_state_io full = {.format = MT_STATE_FULL}; /* only its format is recorded */
    json_t *lora = lora_json(lt);
    rc = ckpt_save_last_lora(dir, st, &full, args, lora, &files);
    json_decref(lora);
    return rc;
}

int mt_lora_checkpoint_save(const char *out_dir, const mt_lora_table *lt, const float *w,
                            const float *exp_avg, const float *exp_avg_sq, const mt_ckpt_state *st,
                            const char *args_json, const char *base_model, int keep_last) {
    const float *const arena[N_ARENAS] = {w, exp_avg, exp_avg_sq};
    if (lt->n_params == 0)
        return mt_error_set("%s: the adapter table has no tensors to checkpoint", out_dir);
    MT_TRY(check_finite(out_dir, st->step, lt, arena)); /* before anything is written */
    json_t *args;
    ckpt_tmp_dir d;
    MT_TRY(ckpt_tmp_open(out_dir, st->step, args_json, NULL, &args, &d));
    int rc = save_contents(d.tmp, lt, arena, st, args, base_model);
    if (rc == MT_OK) rc = ckpt_tmp_publish(&d, keep_last, st->in_a_row);
    else ckpt_tmp_abort(&d);
    json_decref(args);
    return rc;
}

/* ---- resume ---- */

/* Whether name (len chars) is one of the comma-separated list. */
static int listed(const char *list, const char *name, size_t len) {
    for (const char *p = list;;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, name, len) == 0) return 1;
        if (!end) return 0;
        p = end + 1;
    }
}

/* Every name of a is in b (PEFT holds target_modules as a set: the order is not the adapter's). */
static int subset(const char *a, const char *b) {
    for (const char *p = a;;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (!listed(b, p, n)) return 0;
        if (!end) return 1;
        p = end + 1;
    }
}

/* The checkpoint's adapter is the run's: r, lora_alpha, target_modules; else MT_ERR naming each
 * that differs. */
static int check_same_adapter(const char *dir, const ckpt_lora_info *disk, const mt_lora_table *lt) {
    char diff[1400] = "";
    size_t n = 0;
    if (disk->r != lt->rank)
        n += (size_t)snprintf(diff + n, sizeof diff - n, "; r is %d, this run's %d", disk->r, lt->rank);
    if (disk->alpha != lt->alpha)
        n += (size_t)snprintf(diff + n, sizeof diff - n, "; lora_alpha is %.17g, this run's %.17g",
                              disk->alpha, lt->alpha);
    if (!subset(disk->targets, lt->targets) || !subset(lt->targets, disk->targets))
        snprintf(diff + n, sizeof diff - n, "; target_modules are %s, this run's %s", disk->targets,
                 lt->targets);
    if (!diff[0]) return MT_OK;
    return mt_error_set("%s: a LoRA checkpoint of another adapter (%s): resume with the same "
                        "--lora, --lora-alpha and --lora-targets", dir, diff + 2);
}

/* FILE holds exactly the adapter's tensors of arenas [a0, a1): each F32 of its shape. */
static int check_file(const mt_safetensors *sf, const char *path, const mt_lora_table *lt,
                      const mt_param_table *t, int a0, int a1) {
    char name[LORA_PART_NAME];
    for (int i = 0; i < lt->n_params; i++) {
        const mt_lora_param *p = &lt->params[i];
        for (int a = a0; a < a1; a++) {
            part_name(name, sizeof name, a, p);
            const mt_st_tensor *x = mt_safetensors_find(sf, name);
            if (!x) return mt_error_set("%s: tensor %s is missing", path, name);
            if (x->dtype != MT_F32)
                return mt_error_set("%s: tensor %s: dtype %s, a LoRA checkpoint stores F32", path,
                                    name, mt_dtype_name(x->dtype));
            if (x->ndim != 2 || x->shape[0] != p->shape[0] || x->shape[1] != p->shape[1])
                return mt_error_set("%s: tensor %s: shape differs from the adapter's [%lld, %lld]",
                                    path, name, (long long)p->shape[0], (long long)p->shape[1]);
        }
    }
    int want = lt->n_params * (a1 - a0);
    if (mt_safetensors_count(sf) != want)
        return mt_error_set("%s: %d tensors, the adapter of this %s model has %d (tensors that are "
                            "not its %s)", path, mt_safetensors_count(sf), t->cfg.model_type, want,
                            a0 == ARENA_W ? "lora_A/lora_B" : "exp_avg/exp_avg_sq");
    return MT_OK;
}

typedef struct {
    const mt_param_table *t;
    const mt_lora_table *lt;
    float *arena[N_ARENAS];
    mt_ckpt_state *st;
} lora_resume;

/* The tensor of arena a of adapter tensor i in the two open files. */
static const mt_st_tensor *find_part(mt_safetensors *const sf[2], int a, const mt_lora_param *p) {
    char name[LORA_PART_NAME];
    part_name(name, sizeof name, a, p);
    return mt_safetensors_find(sf[a == ARENA_W ? 0 : 1], name);
}

/* Checks every tensor (shape, dtype, bounds) before the arenas are written. */
static int load_tensors(const lora_resume *c, const char *dir) {
    const mt_lora_table *lt = c->lt;
    char *path[2] = {ckpt_path_join(dir, CKPT_LORA_WEIGHTS), ckpt_path_join(dir, CKPT_LORA_OPTIM)};
    mt_safetensors *sf[2] = {NULL, NULL};
    int rc = mt_safetensors_open_file(&sf[0], path[0]);
    if (rc == MT_OK) rc = check_file(sf[0], path[0], lt, c->t, ARENA_W, ARENA_M);
    if (rc == MT_OK) rc = mt_safetensors_open_file(&sf[1], path[1]);
    if (rc == MT_OK) rc = check_file(sf[1], path[1], lt, c->t, ARENA_M, N_ARENAS);
    for (int i = 0; i < lt->n_params && rc == MT_OK; i++)
        for (int a = 0; a < N_ARENAS && rc == MT_OK; a++) {
            const mt_st_tensor *x = find_part(sf, a, &lt->params[i]);
            rc = ckpt_check_values(x->path, x->name, x->data, x->numel, ckpt_bound_of(PART[a]));
        }
    if (rc == MT_OK) { /* only now: a bad checkpoint never leaves the arenas half written */
        for (int a = 0; a < N_ARENAS; a++) {
            memset(c->arena[a], 0, sizeof(float) * (size_t)lt->total);
            for (int i = 0; i < lt->n_params; i++) {
                const mt_st_tensor *x = find_part(sf, a, &lt->params[i]);
                memcpy(c->arena[a] + lt->params[i].offset, x->data, x->nbytes);
            }
        }
    }
    for (int k = 0; k < 2; k++) {
        mt_safetensors_close(sf[k]);
        free(path[k]);
    }
    return rc;
}

/* One step_ directory: *stop for a checkpoint of another kind or adapter (not damage). */
static int load_one(void *ctx, const char *dir, int *stop) {
    lora_resume *c = ctx;
    mt_ckpt_state s = {0};
    ckpt_file_list files;
    ckpt_lora_info info;
    int format = 0;
    *stop = 0;
    int rc = ckpt_read_state(dir, &s, &format, &files, &info);
    if (rc == MT_OK && !s.lora) {
        rc = mt_error_set("%s: a full-parameter checkpoint, not a LoRA run's: resume it without "
                          "--lora and --adapter", dir);
        *stop = 1;
    }
    if (rc == MT_OK && check_same_adapter(dir, &info, c->lt) != MT_OK) {
        rc = MT_ERR;
        *stop = 1;
    }
    if (rc == MT_OK) rc = ckpt_verify_files(dir, &files);
    if (rc == MT_OK) rc = load_tensors(c, dir);
    if (rc == MT_OK) *c->st = s;
    else mt_ckpt_state_free(&s);
    return rc;
}

int mt_lora_checkpoint_resume(const char *out_dir, const mt_param_table *t, const mt_lora_table *lt,
                              float *w, float *exp_avg, float *exp_avg_sq, mt_ckpt_state *st,
                              char *path, size_t path_size) {
    lora_resume c = {t, lt, {w, exp_avg, exp_avg_sq}, st};
    return ckpt_resume_newest(out_dir, load_one, &c, path, path_size);
}
