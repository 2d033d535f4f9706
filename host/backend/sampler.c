// Sampling chain with llama.cpp's semantics (src/llama-sampling.cpp).
#include "host/backend/sampler.h"

#include "host/ops/backend.h" // struct sample_params

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void sampler_params_default(struct sampler_params *p) {
    p->temp = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = SAMPLER_SEED_RANDOM;
    p->bias = NULL;
    p->n_bias = 0;
    p->grammar = NULL;
    p->grammar_vocab = NULL;
}

// --- candidates ----------------------------------------------------------------

void sampler_apply_bias(struct sampler_cands *c, const struct sampler_bias *b, int n) {
    for (int i = 0; i < n; i++)
        if (b[i].token >= 0 && (size_t)b[i].token < c->size)
            c->data[b[i].token].logit += b[i].bias;
}

static int cand_cmp_desc(const void *a, const void *b) {
    const struct sampler_cand *x = a, *y = b;
    if (x->logit > y->logit)
        return -1;
    if (x->logit < y->logit)
        return 1;
    // Ties: lower id first, so results never depend on qsort's order.
    return (x->id > y->id) - (x->id < y->id);
}

static void cands_sort(struct sampler_cands *c) {
    if (!c->sorted) {
        qsort(c->data, c->size, sizeof *c->data, cand_cmp_desc);
        c->sorted = true;
    }
}

// Moves the k best candidates to the front (in any order): quickselect.
static void cands_select(struct sampler_cand *d, size_t n, size_t k) {
    size_t lo = 0, hi = n; // the k-th lies in [lo, hi)
    while (hi - lo > 1) {
        // median of three as pivot
        size_t mid = lo + (hi - lo) / 2;
        struct sampler_cand a = d[lo], b = d[mid], cc = d[hi - 1], piv;
        if (cand_cmp_desc(&a, &b) < 0)
            piv = cand_cmp_desc(&b, &cc) < 0 ? b : (cand_cmp_desc(&a, &cc) < 0 ? cc : a);
        else
            piv = cand_cmp_desc(&a, &cc) < 0 ? a : (cand_cmp_desc(&b, &cc) < 0 ? cc : b);
        // three-way partition: [lo, lt) better, [lt, gt) equal, [gt, hi) worse
        size_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            int r = cand_cmp_desc(&d[i], &piv);
            if (r < 0) {
                struct sampler_cand t = d[lt];
                d[lt++] = d[i];
                d[i++] = t;
            } else if (r > 0) {
                struct sampler_cand t = d[--gt];
                d[gt] = d[i];
                d[i] = t;
            } else {
                i++;
            }
        }
        if (k < lt)
            hi = lt;
        else if (k >= gt)
            lo = gt;
        else
            return;
    }
}

static int i32_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void penalize(struct sampler_cands *c, int32_t id, int count, float repeat, float freq,
                     float presence) {
    struct sampler_cand *cd = NULL;
    // Fresh candidates are indexed by id; fall back to a scan otherwise.
    if (id >= 0 && (size_t)id < c->size && c->data[id].id == id) {
        cd = &c->data[id];
    } else {
        for (size_t i = 0; i < c->size; i++)
            if (c->data[i].id == id) {
                cd = &c->data[i];
                break;
            }
    }
    if (!cd)
        return;
    // Dividing a negative logit would make the token more likely.
    if (cd->logit <= 0)
        cd->logit *= repeat;
    else
        cd->logit /= repeat;
    cd->logit -= (float)count * freq + presence;
}

void sampler_apply_penalties(struct sampler_cands *c, const int32_t *last, int n_last, float repeat,
                             float freq, float presence) {
    if (n_last <= 0 || (repeat == 1.0f && freq == 0.0f && presence == 0.0f))
        return;
    // Distinct tokens of the window with their counts (a sorted copy), then
    // only the penalized candidates are visited: the window is short, the
    // vocabulary is not.
    int32_t *w = malloc((size_t)n_last * sizeof *w);
    if (!w) {
        // Out of memory: the same result, quadratically.
        for (int j = 0; j < n_last; j++) {
            int count = 0, first = 1;
            for (int k = 0; k < n_last; k++)
                if (last[k] == last[j]) {
                    if (k < j)
                        first = 0;
                    count++;
                }
            if (first)
                penalize(c, last[j], count, repeat, freq, presence);
        }
    } else {
        memcpy(w, last, (size_t)n_last * sizeof *w);
        qsort(w, (size_t)n_last, sizeof *w, i32_cmp);
        for (int j = 0; j < n_last;) {
            int k = j;
            while (k < n_last && w[k] == w[j])
                k++;
            penalize(c, w[j], k - j, repeat, freq, presence);
            j = k;
        }
        free(w);
    }
    c->sorted = false;
}

void sampler_apply_top_k(struct sampler_cands *c, int k) {
    if (k <= 0 || c->size == 0)
        return;
    size_t kk = (size_t)k < c->size ? (size_t)k : c->size;
    if (!c->sorted) {
        if (kk < c->size)
            cands_select(c->data, c->size, kk);
        c->size = kk;
        qsort(c->data, c->size, sizeof *c->data, cand_cmp_desc);
        c->sorted = true;
    } else {
        c->size = kk;
    }
}

void sampler_softmax(struct sampler_cands *c) {
    if (c->size == 0)
        return;
    cands_sort(c);
    float max = c->data[0].logit;
    double sum = 0;
    for (size_t i = 0; i < c->size; i++) {
        float e = expf(c->data[i].logit - max);
        c->data[i].p = e;
        sum += e;
    }
    for (size_t i = 0; i < c->size; i++)
        c->data[i].p = (float)(c->data[i].p / sum);
}

void sampler_apply_top_p(struct sampler_cands *c, float p, size_t min_keep) {
    if (p >= 1.0f || c->size == 0)
        return;
    sampler_softmax(c);
    float cum = 0;
    size_t last = c->size;
    for (size_t i = 0; i < c->size; i++) {
        cum += c->data[i].p;
        if (cum >= p && i + 1 >= min_keep) {
            last = i + 1;
            break;
        }
    }
    c->size = last;
}

void sampler_apply_min_p(struct sampler_cands *c, float p, size_t min_keep) {
    if (p <= 0.0f || c->size == 0)
        return;
    float max = c->data[0].logit;
    if (!c->sorted)
        for (size_t i = 1; i < c->size; i++)
            if (c->data[i].logit > max)
                max = c->data[i].logit;
    const float min_logit = max + logf(p);
    size_t n = 0;
    for (size_t i = 0; i < c->size; i++)
        n += c->data[i].logit >= min_logit;
    if (n < min_keep)
        return; // never for min_keep <= 1: the max always passes
    n = 0;
    for (size_t i = 0; i < c->size; i++)
        if (c->data[i].logit >= min_logit)
            c->data[n++] = c->data[i]; // keeps the order, so sortedness survives
    c->size = n;
}

void sampler_apply_temp(struct sampler_cands *c, float t) {
    if (t <= 0)
        return;
    for (size_t i = 0; i < c->size; i++)
        c->data[i].logit /= t;
}

// --- RNG -----------------------------------------------------------------------

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void sampler_rng_seed(struct sampler_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl64(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t sampler_rng_next(struct sampler_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

double sampler_rng_uniform(struct sampler_rng *r) {
    return (double)(sampler_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

int32_t sampler_dist(struct sampler_cands *c, struct sampler_rng *r) {
    return sampler_dist_u(c, sampler_rng_uniform(r));
}

int32_t sampler_dist_u(struct sampler_cands *c, double u) {
    sampler_softmax(c);
    double cum = 0;
    for (size_t i = 0; i < c->size; i++) {
        cum += c->data[i].p;
        if (u < cum)
            return c->data[i].id;
    }
    // Rounding left the sum a hair below u: the last candidate takes it.
    return c->data[c->size - 1].id;
}

// --- the chain -----------------------------------------------------------------

struct sampler {
    struct sampler_params p;
    int n_vocab;
    uint32_t seed;
    struct sampler_rng rng;
    struct sampler_cand *cands; // [n_vocab]
    int32_t *last;              // [n_last] ring of accepted tokens
    int n_last;                 // capacity
    int n_hist;                 // tokens held (<= n_last)
    int head;                   // next write position
    int32_t *window;            // [n_last] scratch: the history in order
    struct sampler_bias *bias;  // [p.n_bias] owned copy (p.bias points here)
    // With a grammar: its state (holding the sampler's reference to
    // p.grammar) and the trie walk's scratch.
    struct grammar_state *gst;
    int32_t *allowed; // [n_vocab] ids the grammar allows
    uint8_t *keep;    // [n_vocab] all 0 between calls
};

static uint32_t random_seed(void) {
    uint32_t s = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&s, sizeof s, 1, f) != 1)
            s = 0;
        fclose(f);
    }
    if (!s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint32_t)(ts.tv_nsec ^ ts.tv_sec);
    }
    // Never hand back the "random" sentinel itself: the reported seed must replay.
    return s == SAMPLER_SEED_RANDOM ? 1u : s;
}

int sampler_check_bias(const struct sampler_bias *b, int n, int n_vocab, struct verr *err) {
    if (n < 0 || n > SAMPLER_MAX_BIAS || (n > 0 && !b))
        return verr_set(err, VERR_RANGE, "%d logit bias entries: 0 .. %d", n, SAMPLER_MAX_BIAS);
    for (int i = 0; i < n; i++) {
        if (b[i].token < 0 || b[i].token >= n_vocab)
            return verr_set(err, VERR_RANGE, "logit bias: token id %d is out of range (n_vocab %d)",
                            b[i].token, n_vocab);
        if (!(isfinite(b[i].bias) || b[i].bias == -INFINITY))
            return verr_set(err, VERR_RANGE,
                            "logit bias of token %d: %g (a finite number, or -inf: never)",
                            b[i].token, (double)b[i].bias);
    }
    return 0;
}

// The grammar's state and scratch for s; VERR_RANGE without a matching vocabulary.
static int sampler_grammar_init(struct sampler *s, const struct sampler_params *p, int n_vocab,
                                struct verr *err) {
    if (!p->grammar_vocab || grammar_vocab_n_tokens(p->grammar_vocab) != n_vocab)
        return verr_set(err, VERR_RANGE,
                        "sampler: a grammar needs the model's token trie (grammar_vocab of %d "
                        "tokens), got %d",
                        n_vocab, p->grammar_vocab ? grammar_vocab_n_tokens(p->grammar_vocab) : 0);
    int rc = grammar_state_new(&s->gst, p->grammar, err);
    if (rc)
        return rc;
    s->allowed = malloc((size_t)n_vocab * sizeof *s->allowed);
    s->keep = calloc((size_t)n_vocab, 1);
    if (!s->allowed || !s->keep)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    return 0;
}

int sampler_create(struct sampler **out, const struct sampler_params *p, int n_vocab,
                   struct verr *err) {
    *out = NULL;
    if (n_vocab <= 0)
        return verr_set(err, VERR_RANGE, "sampler: n_vocab %d must be > 0", n_vocab);
    if (p->repeat_last_n < 0)
        return verr_set(err, VERR_RANGE, "sampler: repeat_last_n %d: pass the context size for -1",
                        p->repeat_last_n);
    int rc = sampler_check_bias(p->bias, p->n_bias, n_vocab, err);
    if (rc)
        return rc;
    struct sampler *s = calloc(1, sizeof *s);
    if (!s)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    s->p = *p;
    s->p.bias = NULL;
    if (p->n_bias > 0) {
        if (!(s->bias = malloc((size_t)p->n_bias * sizeof *s->bias))) {
            free(s);
            return verr_set(err, VERR_NOMEM, "out of host memory");
        }
        memcpy(s->bias, p->bias, (size_t)p->n_bias * sizeof *s->bias);
        s->p.bias = s->bias;
    }
    if (p->grammar && (rc = sampler_grammar_init(s, p, n_vocab, err))) {
        sampler_free(s);
        return rc;
    }
    s->n_vocab = n_vocab;
    s->seed = p->seed == SAMPLER_SEED_RANDOM ? random_seed() : p->seed;
    s->n_last = p->repeat_last_n;
    s->cands = malloc((size_t)n_vocab * sizeof *s->cands);
    s->last = calloc((size_t)s->n_last + 1, sizeof *s->last);
    s->window = calloc((size_t)s->n_last + 1, sizeof *s->window);
    if (!s->cands || !s->last || !s->window) {
        sampler_free(s);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    sampler_reset(s);
    *out = s;
    return 0;
}

void sampler_free(struct sampler *s) {
    if (!s)
        return;
    free(s->cands);
    free(s->last);
    free(s->window);
    free(s->bias);
    grammar_state_free(s->gst);
    free(s->allowed);
    free(s->keep);
    free(s);
}

uint32_t sampler_seed(const struct sampler *s) {
    return s->seed;
}

void sampler_reset(struct sampler *s) {
    s->n_hist = 0;
    s->head = 0;
    sampler_rng_seed(&s->rng, s->seed);
    if (s->gst)
        grammar_state_reset(s->gst);
}

void sampler_accept_prompt(struct sampler *s, int32_t token) {
    if (s->n_last <= 0)
        return;
    s->last[s->head] = token;
    s->head = (s->head + 1) % s->n_last;
    if (s->n_hist < s->n_last)
        s->n_hist++;
}

int sampler_accept_checked(struct sampler *s, int32_t token, struct verr *err) {
    sampler_accept_prompt(s, token);
    return s->gst ? grammar_state_accept(s->gst, s->p.grammar_vocab, token, err) : 0;
}

int sampler_accept(struct sampler *s, int32_t token) {
    return sampler_accept_checked(s, token, NULL);
}

const struct grammar_state *sampler_grammar_state(const struct sampler *s) {
    return s->gst;
}

// Every token as a candidate (candidate i is token i), the logit bias and
// the penalties applied.
static struct sampler_cands sampler_fill(struct sampler *s, const float *logits) {
    struct sampler_cands c = {s->cands, (size_t)s->n_vocab, false};
    for (int i = 0; i < s->n_vocab; i++) {
        s->cands[i].id = i;
        s->cands[i].logit = logits[i];
        s->cands[i].p = 0;
    }
    sampler_apply_bias(&c, s->p.bias, s->p.n_bias);
    // The ring's contents in any order: counts do not depend on order.
    int start = (s->head - s->n_hist + s->n_last) % (s->n_last ? s->n_last : 1);
    for (int i = 0; i < s->n_hist; i++)
        s->window[i] = s->last[(start + i) % s->n_last];
    sampler_apply_penalties(&c, s->window, s->n_hist, s->p.repeat_penalty, s->p.frequency_penalty,
                            s->p.presence_penalty);
    return c;
}

// The chain again over the tokens the grammar allows (in id order, as the
// first pass saw them), with a fresh draw.
static int sampler_resample(struct sampler *s, const float *logits, int32_t *token,
                            struct verr *err) {
    int32_t n = 0;
    int rc = grammar_state_allowed(s->gst, s->p.grammar_vocab, s->allowed, &n, err);
    if (rc)
        return rc;
    if (n == 0)
        return verr_set(err, VERR_RANGE, "grammar: no token can continue the output here (%s)",
                        grammar_state_can_end(s->gst) ? "the grammar has ended and the model has "
                                                        "no end-of-generation token"
                                                      : "what the grammar expects next is in no "
                                                        "token of the vocabulary");
    struct sampler_cands c = sampler_fill(s, logits);
    for (int32_t k = 0; k < n; k++)
        s->keep[s->allowed[k]] = 1;
    size_t m = 0;
    for (size_t i = 0; i < c.size; i++)
        if (s->keep[c.data[i].id])
            c.data[m++] = c.data[i];
    c.size = m;
    for (int32_t k = 0; k < n; k++)
        s->keep[s->allowed[k]] = 0;
    const double u = s->p.temp <= 0 ? 0.0 : sampler_rng_uniform(&s->rng);
    *token = sampler_chain(&c, s->p.temp, s->p.top_k, s->p.top_p, s->p.min_p, u);
    return 0;
}

int sampler_sample_checked(struct sampler *s, const float *logits, int32_t *token,
                           struct verr *err) {
    struct sampler_cands c = sampler_fill(s, logits);
    // Greedy takes no draw: the random sequence advances only when sampling.
    const double u = s->p.temp <= 0 ? 0.0 : sampler_rng_uniform(&s->rng);
    const int32_t tok = sampler_chain(&c, s->p.temp, s->p.top_k, s->p.top_p, s->p.min_p, u);
    if (!s->gst || grammar_state_allows(s->gst, s->p.grammar_vocab, tok)) {
        *token = tok;
        return 0;
    }
    return sampler_resample(s, logits, token, err);
}

int32_t sampler_sample(struct sampler *s, const float *logits) {
    int32_t tok = -1;
    return sampler_sample_checked(s, logits, &tok, NULL) ? -1 : tok;
}

int32_t sampler_chain(struct sampler_cands *c, float temp, int top_k, float top_p, float min_p,
                      double u) {
    if (c->size == 0)
        return 0;
    if (temp <= 0) {
        size_t best = 0;
        for (size_t i = 1; i < c->size; i++)
            if (c->data[i].logit > c->data[best].logit)
                best = i;
        return c->data[best].id;
    }
    // The order of the candidates dist walks (what the CUDA op must
    // reproduce): top_k or top_p sort by logit, and temp keeps that order; with
    // both off, dist sorts the logits after temp, where dividing can make new
    // ties that then go to the lower id.
    sampler_apply_top_k(c, top_k);
    sampler_apply_top_p(c, top_p, 1);
    sampler_apply_min_p(c, min_p, 1);
    sampler_apply_temp(c, temp);
    return sampler_dist_u(c, u);
}

bool sampler_penalties_off(const struct sampler *s) {
    return s->p.n_bias == 0 && !s->gst &&
           (s->n_last == 0 || (s->p.repeat_penalty == 1.0f && s->p.frequency_penalty == 0.0f &&
                               s->p.presence_penalty == 0.0f));
}

void sampler_next_params(struct sampler *s, struct sample_params *out) {
    out->temp = s->p.temp;
    out->top_k = s->p.top_k;
    out->top_p = s->p.top_p;
    out->min_p = s->p.min_p;
    out->u = s->p.temp <= 0 ? 0.0 : sampler_rng_uniform(&s->rng);
}

void sampler_describe(const struct sampler *s, char *buf, size_t cap) {
    const struct sampler_params *p = &s->p;
    if (s->gst) {
        int n = snprintf(buf, cap, "grammar(%d rules) -> ", grammar_n_rules(p->grammar));
        if (n < 0 || (size_t)n >= cap)
            return;
        buf += n;
        cap -= (size_t)n;
    }
    if (p->n_bias > 0) {
        int n = snprintf(buf, cap, "logit_bias(%d) -> ", p->n_bias);
        if (n < 0 || (size_t)n >= cap)
            return;
        buf += n;
        cap -= (size_t)n;
    }
    if (p->temp <= 0)
        snprintf(buf, cap, "penalties(last_n=%d, repeat=%.3f, freq=%.3f, present=%.3f) -> greedy",
                 p->repeat_last_n, p->repeat_penalty, p->frequency_penalty, p->presence_penalty);
    else
        snprintf(buf, cap,
                 "penalties(last_n=%d, repeat=%.3f, freq=%.3f, present=%.3f) -> top_k(%d) -> "
                 "top_p(%.3f) -> min_p(%.3f) -> temp(%.3f) -> dist(seed=%u)",
                 p->repeat_last_n, p->repeat_penalty, p->frequency_penalty, p->presence_penalty,
                 p->top_k, p->top_p, p->min_p, p->temp, s->seed);
}
