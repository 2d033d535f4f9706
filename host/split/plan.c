// The layer split plan (see plan.h).
#include "host/split/plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dev_name(const struct plan_input *in, int d, char *buf, size_t cap) {
    if (in->device_names && in->device_names[d])
        return in->device_names[d];
    snprintf(buf, cap, "device %d", d);
    return buf;
}

// Human-readable bytes: "1.50 GiB", "12.0 MiB", "512 B".
static const char *fmt_bytes(size_t b, char *buf, size_t cap) {
    if (b == BACKEND_MEM_UNLIMITED)
        snprintf(buf, cap, "unlimited");
    else if (b >= (size_t)1 << 30)
        snprintf(buf, cap, "%.2f GiB", (double)b / (double)(1u << 30));
    else if (b >= (size_t)1 << 20)
        snprintf(buf, cap, "%.1f MiB", (double)b / (double)(1u << 20));
    else if (b >= (size_t)1 << 10)
        snprintf(buf, cap, "%.1f KiB", (double)b / 1024.0);
    else
        snprintf(buf, cap, "%zu B", b);
    return buf;
}

static size_t sat_add(size_t a, size_t b) {
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static size_t sat_mul(size_t a, size_t b) {
    return a && b > SIZE_MAX / a ? SIZE_MAX : a * b;
}

// Fills the byte counts of stage s (its l0/l1 and device are set).
static void stage_bytes(const struct plan_input *in, struct plan_stage *st, bool first, bool last) {
    size_t w = 0;
    for (int il = st->l0; il < st->l1; il++)
        w = sat_add(w, in->layer_bytes[il]);
    if (first)
        w = sat_add(w, in->embed_bytes);
    if (last)
        w = sat_add(w, in->head_bytes);
    st->weight_bytes = w;
    st->kv_bytes = sat_mul(in->kv_bytes_per_layer, (size_t)(st->l1 - st->l0));
    st->scratch_bytes = sat_add(in->scratch_bytes, last ? in->head_scratch_bytes : 0);
    st->total_bytes = sat_add(sat_add(st->weight_bytes, st->kv_bytes), st->scratch_bytes);
    st->free_bytes = in->free_bytes ? in->free_bytes[st->device] : BACKEND_MEM_UNLIMITED;
}

static bool stage_fits(const struct plan_input *in, const struct plan_stage *st) {
    if (st->free_bytes == BACKEND_MEM_UNLIMITED)
        return true;
    return sat_add(st->total_bytes, in->reserve_bytes) <= st->free_bytes;
}

static void fill_ranges(struct plan *p, const struct plan_input *in, const int *count) {
    int l = 0;
    for (int s = 0; s < p->n_stages; s++) {
        p->stage[s].l0 = l;
        l += count[s];
        p->stage[s].l1 = l;
        stage_bytes(in, &p->stage[s], s == 0, s == p->n_stages - 1);
    }
}

// The devices' shares: the user's proportions, else free memory (equal
// shares when some device's memory is not limited, since "unlimited" has no
// size). *sum > 0 on success.
static int device_weights(const struct plan_input *in, double *w, double *sum, struct verr *err) {
    char nb[64];
    bool any_unlimited = false;
    for (int d = 0; d < in->n_devices; d++)
        if (!in->free_bytes || in->free_bytes[d] == BACKEND_MEM_UNLIMITED)
            any_unlimited = true;
    *sum = 0;
    for (int d = 0; d < in->n_devices; d++) {
        if (in->split) {
            float v = in->split[d];
            if (!isfinite(v) || v < 0)
                return verr_set(err, VERR_RANGE,
                                "--tensor-split: proportion %g for %s must be a number >= 0", v,
                                dev_name(in, d, nb, sizeof nb));
            w[d] = v;
        } else {
            w[d] = any_unlimited ? 1.0 : (double)in->free_bytes[d];
        }
        *sum += w[d];
    }
    if (!(*sum > 0))
        return verr_set(err, VERR_RANGE,
                        in->split ? "--tensor-split: every proportion is 0"
                                  : "split: no device has free memory");
    return 0;
}

// llama.cpp's assignment of layers to the n_active devices with a share:
// layer il goes to the first device whose cumulative share exceeds
// il / n_layer; then every device gets at least one layer, taken from the
// device holding the most (its neighbours' ranges just slide).
static void assign_layers(const struct plan_input *in, const double *w, double sum,
                          const int *active, int n_active, int *count) {
    double cum[PLAN_MAX_DEVICES], acc = 0;
    for (int k = 0; k < n_active; k++) {
        acc += w[active[k]];
        cum[k] = acc / sum;
    }
    cum[n_active - 1] = 1.0; // no layer may fall off the end through rounding
    for (int k = 0; k < n_active; k++)
        count[k] = 0;
    for (int il = 0; il < in->n_layer; il++) {
        double x = (double)il / (double)in->n_layer;
        int k = 0;
        while (k < n_active - 1 && !(x < cum[k]))
            k++;
        count[k]++;
    }
    for (int k = 0; k < n_active; k++) {
        while (count[k] == 0) {
            int big = 0;
            for (int j = 1; j < n_active; j++)
                if (count[j] > count[big])
                    big = j;
            count[big]--;
            count[k]++;
        }
    }
}

// By free memory (no --tensor-split), the fixed costs of the first and last
// stage can push them over: slide boundary layers to a neighbour with room.
static void rebalance(struct plan *out, const struct plan_input *in, int *count) {
    const int n_active = out->n_stages;
    for (int iter = 0; iter < in->n_layer * n_active; iter++) {
        int over = -1;
        for (int k = 0; k < n_active && over < 0; k++)
            if (!stage_fits(in, &out->stage[k]))
                over = k;
        if (over < 0 || count[over] <= 1)
            break;
        bool moved = false;
        for (int dir = 1; dir >= -1 && !moved; dir -= 2) {
            int nbk = over + dir;
            if (nbk < 0 || nbk >= n_active)
                continue;
            count[over]--;
            count[nbk]++;
            fill_ranges(out, in, count);
            if (stage_fits(in, &out->stage[nbk])) {
                moved = true;
            } else {
                count[over]++;
                count[nbk]--;
                fill_ranges(out, in, count);
            }
        }
        if (!moved)
            break;
    }
}

// VERR_NOMEM naming the first stage that does not fit, with what it needs
// and what would help; 0 when every stage fits.
static int check_fit(const struct plan *out, const struct plan_input *in, struct verr *err) {
    char nb[64], b1[32], b2[32];
    const int n_active = out->n_stages;
    size_t need = 0, have = 0;
    bool limited = true;
    for (int k = 0; k < n_active; k++) {
        need = sat_add(need, sat_add(out->stage[k].total_bytes, in->reserve_bytes));
        if (out->stage[k].free_bytes == BACKEND_MEM_UNLIMITED)
            limited = false;
        else
            have = sat_add(have, out->stage[k].free_bytes);
    }
    for (int k = 0; k < n_active; k++) {
        const struct plan_stage *st = &out->stage[k];
        if (stage_fits(in, st))
            continue;
        char bw[32], bk[32], bs[32];
        return verr_set(
            err, VERR_NOMEM,
            "split: stage %d on %s (layers %d-%d) needs %s (weights %s, KV cache %s, scratch %s"
            "%s) but the device has %s free%s",
            k, dev_name(in, st->device, nb, sizeof nb), st->l0, st->l1 - 1,
            fmt_bytes(sat_add(st->total_bytes, in->reserve_bytes), b1, sizeof b1),
            fmt_bytes(st->weight_bytes, bw, sizeof bw), fmt_bytes(st->kv_bytes, bk, sizeof bk),
            fmt_bytes(st->scratch_bytes, bs, sizeof bs), in->reserve_bytes ? ", plus reserve" : "",
            fmt_bytes(st->free_bytes, b2, sizeof b2),
            limited && need > have
                ? "; the whole model does not fit in the free memory of these devices: use a "
                  "smaller context (-c), more devices or a smaller quantization"
                : (in->split ? "; try other --tensor-split proportions, a smaller context (-c) "
                               "or more devices"
                             : "; try a smaller context (-c) or more devices"));
    }
    return 0;
}

int plan_make(struct plan *out, const struct plan_input *in, struct verr *err) {
    memset(out, 0, sizeof *out);
    if (in->n_layer < 1)
        return verr_set(err, VERR_RANGE, "split: the model has %d layers", in->n_layer);
    if (in->n_devices < 1 || in->n_devices > PLAN_MAX_DEVICES)
        return verr_set(err, VERR_RANGE, "split: %d devices (must be 1..%d)", in->n_devices,
                        PLAN_MAX_DEVICES);
    if (!in->layer_bytes)
        return verr_set(err, VERR_RANGE, "split: no layer sizes");
    double w[PLAN_MAX_DEVICES], sum = 0;
    int rc = device_weights(in, w, &sum, err);
    if (rc)
        return rc;
    int active[PLAN_MAX_DEVICES], n_active = 0;
    for (int d = 0; d < in->n_devices; d++)
        if (w[d] > 0)
            active[n_active++] = d;
    if (n_active > in->n_layer)
        return verr_set(err, VERR_RANGE,
                        "split: %d stages for a model of %d layer%s: every stage needs at least "
                        "one layer (give fewer --devices, or 0 in --tensor-split for some)",
                        n_active, in->n_layer, in->n_layer == 1 ? "" : "s");
    int count[PLAN_MAX_DEVICES];
    assign_layers(in, w, sum, active, n_active, count);
    out->n_stages = n_active;
    out->n_layer = in->n_layer;
    for (int k = 0; k < n_active; k++)
        out->stage[k].device = active[k];
    fill_ranges(out, in, count);
    // With the user's proportions the plan is what was asked for.
    if (!in->split)
        rebalance(out, in, count);
    if ((rc = check_fit(out, in, err)))
        memset(out, 0, sizeof *out);
    return rc;
}

void plan_format(const struct plan *p, const char *const *device_names, char *buf, size_t cap) {
    size_t len = 0;
    if (cap)
        buf[0] = 0;
    for (int s = 0; s < p->n_stages && len < cap; s++) {
        const struct plan_stage *st = &p->stage[s];
        char w[32], k[32], sc[32], t[32], f[32], dn[32];
        const char *name = device_names ? device_names[st->device] : NULL;
        if (!name) {
            snprintf(dn, sizeof dn, "device %d", st->device);
            name = dn;
        }
        int n = snprintf(buf + len, cap - len,
                         "stage %d: %-8s layers %d-%d (%d)%s%s, weights %s, KV %s, scratch %s, "
                         "total %s of %s free\n",
                         s, name, st->l0, st->l1 - 1, st->l1 - st->l0, s == 0 ? " +embed" : "",
                         s == p->n_stages - 1 ? " +head" : "", fmt_bytes(st->weight_bytes, w, 32),
                         fmt_bytes(st->kv_bytes, k, 32), fmt_bytes(st->scratch_bytes, sc, 32),
                         fmt_bytes(st->total_bytes, t, 32), fmt_bytes(st->free_bytes, f, 32));
        if (n < 0)
            break;
        len += (size_t)n;
    }
}

int plan_parse_split(const char *s, float *out, int max, int *n, struct verr *err) {
    *n = 0;
    if (!s || !*s)
        return verr_set(err, VERR_RANGE, "--tensor-split: empty value (expected e.g. 3,1)");
    const char *p = s;
    double sum = 0;
    for (;;) {
        const char *end = p;
        while (*end && *end != ',' && *end != '/')
            end++;
        char tok[64];
        size_t len = (size_t)(end - p);
        if (len == 0 || len >= sizeof tok)
            return verr_set(err, VERR_RANGE,
                            "--tensor-split: '%s': empty or overlong value at position %d", s,
                            *n + 1);
        memcpy(tok, p, len);
        tok[len] = 0;
        char *e;
        errno = 0;
        float v = strtof(tok, &e);
        if (e == tok || *e || errno || !isfinite(v) || v < 0)
            return verr_set(err, VERR_RANGE,
                            "--tensor-split: '%s' is not a proportion (a number >= 0)", tok);
        if (*n == max)
            return verr_set(err, VERR_RANGE, "--tensor-split: more than %d values", max);
        out[(*n)++] = v;
        sum += v;
        if (!*end)
            break;
        p = end + 1;
    }
    if (!(sum > 0))
        return verr_set(err, VERR_RANGE, "--tensor-split: '%s': every proportion is 0", s);
    return 0;
}

int plan_parse_devices(const char *s, struct backend_device *out, int max, int *n,
                       struct verr *err) {
    *n = 0;
    if (!s || !*s)
        return verr_set(err, VERR_RANGE, "--devices: empty value (expected e.g. 0,1 or cpu,cpu)");
    const char *p = s;
    for (;;) {
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        char tok[64];
        size_t len = (size_t)(end - p);
        if (len == 0 || len >= sizeof tok)
            return verr_set(err, VERR_RANGE, "--devices: '%s': empty or overlong entry", s);
        memcpy(tok, p, len);
        tok[len] = 0;
        struct backend_device d = {BACKEND_DEVICE_CPU, 0};
        if (!strcmp(tok, "cpu") || !strcmp(tok, "CPU")) {
            d.kind = BACKEND_DEVICE_CPU;
        } else {
            const char *num = tok;
            if (!strncmp(tok, "cuda", 4) || !strncmp(tok, "CUDA", 4)) {
                num = tok + 4;
                if (*num == ':')
                    num++;
            }
            char *e;
            errno = 0;
            long v = strtol(num, &e, 10);
            if (e == num || *e || errno || v < 0 || v > 1023 || *num == '-' || *num == '+')
                return verr_set(err, VERR_RANGE,
                                "--devices: '%s' is not a device (cpu, a CUDA ordinal such as 0, "
                                "or cuda0 / CUDA0)",
                                tok);
            d.kind = BACKEND_DEVICE_CUDA;
            d.ordinal = (int)v;
        }
        if (*n == max)
            return verr_set(err, VERR_RANGE, "--devices: more than %d devices", max);
        out[(*n)++] = d;
        if (!*end)
            break;
        p = end + 1;
    }
    return 0;
}

int plan_check_devices(const struct backend_device *d, int n, int n_cuda, bool built_with_cuda,
                       struct verr *err) {
    for (int i = 0; i < n; i++) {
        if (d[i].kind != BACKEND_DEVICE_CUDA)
            continue;
        if (!built_with_cuda)
            return verr_set(err, VERR_UNSUPPORTED,
                            "--devices: cuda:%d: vela was built without CUDA (use cpu)",
                            d[i].ordinal);
        if (d[i].ordinal >= n_cuda)
            return verr_set(err, VERR_NOTFOUND,
                            "--devices: CUDA device %d does not exist (%d visible device%s%s)",
                            d[i].ordinal, n_cuda, n_cuda == 1 ? "" : "s",
                            n_cuda ? "" : "; check CUDA_VISIBLE_DEVICES and the driver");
    }
    return 0;
}

void load_config_default(struct load_config *c) {
    memset(c, 0, sizeof *c);
    c->backend = LOAD_BACKEND_AUTO;
    c->split_mode = LOAD_SPLIT_LAYER;
    c->be.act = BACKEND_ACT_DEFAULT;
}
