/* kd_trace_digest.c - the per-record digests of a trace (kd_tr_digests), for
 * comparing runs: byte digests, hash-record digests, op-record digests.  A
 * launch's digests are kd_launch_digests' (kd_launch_table.c, Note [Launch
 * table]), computed as kd_trace_read.c validates each launch.  Python-free. */
#include <string.h>

#include "kd_hash.h"
#include "kd_trace.h"
#include "kd_trace_digest.h"

uint64_t kd_dg_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = kd_dg_mix(0x51ED270B27A1B7C5ull, n);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        h = kd_dg_mix(h, v);
    }
    uint64_t tail = 0;
    for (size_t k = 0; i + k < n; k++)
        tail |= (uint64_t)p[i + k] << (8 * k);
    return kd_fmix64(kd_dg_mix(h, tail)) | 1; /* never 0: 0 means "absent" */
}

uint64_t kd_tree_leaf_digest(const uint8_t *p, size_t n)
{
    return kd_dg_bytes(p, n);
}

static uint64_t str_digest(const kd_tr *r, uint32_t id)
{
    return id <= r->nstr ? r->str_dg[id] : 0;
}

uint64_t kd_tr_hash_digest(const kd_hash_rec *h, int w)
{
    if (!(h->flags & (w ? KD_HF_POST : KD_HF_PRE)))
        return 0;
    uint64_t d = kd_dg_mix(0xB5AD4ECEDA1CE2A9ull, h->kinds);
    if (h->kinds & KD_HK_BITWISE)
        d = kd_dg_mix(d, h->bitwise[w]);
    if (h->kinds & (KD_HK_NORM | KD_HK_STATS)) {
        uint64_t u;
        memcpy(&u, &h->l1[w], 8);
        d = kd_dg_mix(kd_dg_mix(kd_dg_mix(kd_dg_mix(d, u), h->nan[w]), h->posinf[w]), h->neginf[w]);
    }
    if (h->kinds & KD_HK_XOR)
        d = kd_dg_mix(d, h->xor64[w]);
    if (h->kinds & KD_HK_STATS) {
        uint64_t u, v;
        memcpy(&u, &h->sum[w], 8);
        memcpy(&v, &h->absmax[w], 8);
        d = kd_dg_mix(kd_dg_mix(d, u), v);
    }
    return d | 1;
}

uint64_t kd_text_prefix_digest(const uint8_t *s, size_t n)
{
    size_t pl = n;
    for (size_t k = 0; k + 6 <= n; k++)
        if (memcmp(s + k, "  ->  ", 6) == 0) {
            pl = k;
            break;
        }
    return kd_dg_bytes(s, pl);
}

/* Note [Returned values]
 * An op that returns no tensor hands the program a value: .item()
 * (aten::_local_scalar_dense), bool(t) (aten::is_nonzero), aten::equal, ...
 * Its record has no output hash; its value is in its text, after "  ->  ".
 * A program that prints or branches on it computed something else when it
 * differs, so such an op is compared by that value (its output digest, and
 * compare's "returned value" output), not only by its inputs: a run whose
 * printed loss differed was said to match when the only reader of the
 * differing tensor was .item().  Only plain values count: numbers, True,
 * False, None, inf, nan, complex numbers ("(1+2j)"), and tuples / lists of
 * them; an object's repr (which
 * may hold an address) or a tensor's text does not. */
static int is_word(const uint8_t *s, size_t n, const char *w)
{
    return strlen(w) == n && memcmp(s, w, n) == 0;
}

uint64_t kd_text_value_digest(const uint8_t *s, size_t n)
{
    size_t k = 0;
    while (k + 6 <= n && memcmp(s + k, "  ->  ", 6) != 0)
        k++;
    if (k + 6 > n)
        return 0; /* no output */
    const uint8_t *v = s + k + 6;
    size_t m = n - k - 6;
    if (m == 0)
        return 0;
    for (size_t i = 0; i < m;) {
        uint8_t c = v[i];
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) {
            size_t j = i;
            while (j < m && ((v[j] >= 'A' && v[j] <= 'Z') || (v[j] >= 'a' && v[j] <= 'z')))
                j++;
            const uint8_t *w = v + i;
            size_t wl = j - i;
            if (!(is_word(w, wl, "True") || is_word(w, wl, "False") || is_word(w, wl, "None") ||
                  is_word(w, wl, "inf") || is_word(w, wl, "nan") || is_word(w, wl, "e") || is_word(w, wl, "E") ||
                  is_word(w, wl, "j") || is_word(w, wl, "infj") || is_word(w, wl, "nanj")))
                return 0;
            i = j;
        } else if ((c >= '0' && c <= '9') || c == '.' || c == '+' || c == '-' || c == ',' || c == ' ' ||
                   c == '(' || c == ')' || c == '[' || c == ']') {
            i++;
        } else {
            return 0;
        }
    }
    return kd_dg_mix(0x52455455524E4544ull, kd_dg_bytes(v, m)); /* "RETURNED" */
}

void kd_op_digests(uint64_t name_dg, uint32_t depth, uint64_t text_pdg, uint64_t text_vdg, uint32_t flags,
                   const uint8_t *in_tree, size_t in_len, const uint8_t *out_tree, size_t out_len,
                   uint64_t out[KD_DG_N])
{
    out[KD_DG_KEY] = kd_dg_mix(2, name_dg);
    out[KD_DG_CONFIG] = 0;
    /* the call's text up to its output ("  ->  "): an .item()'s output is a value */
    out[KD_DG_SHAPE] = kd_dg_mix(depth, text_pdg);
    out[KD_DG_PRE] = (flags & KD_OPF_IN_HASH) ? kd_dg_bytes(in_tree, in_len) : 0;
    out[KD_DG_POST] = (flags & KD_OPF_OUT_HASH) ? kd_dg_bytes(out_tree, out_len) : text_vdg;
}

void kd_tr_op_digests(const kd_tr *r, const kd_tr_op *op, uint64_t out[KD_DG_N])
{
    kd_op_digests(str_digest(r, op->name_id), op->depth, r->str_pdg[op->text_id], r->str_vdg[op->text_id],
                  op->flags, op->in_tree, op->in_len, op->out_tree, op->out_len, out);
}

void kd_tr_digests(const kd_tr *r, uint64_t i, uint64_t out[KD_DG_N])
{
    if (i >= r->nrec) {
        memset(out, 0, KD_DG_N * sizeof out[0]);
        return;
    }
    memcpy(out, &r->dg[i * KD_DG_N], KD_DG_N * sizeof out[0]);
}
