/* The frame loop of Algorithm 1 of "FlexCTC: GPU-powered CTC Beam Decoding with advanced
 * Contextual Abilities" as one native call for the CPU.
 *
 * The same search as FrameStep.__call__ / FrameStep.full in step.py, over every frame
 * and every utterance of a batch in one call: on a CPU the torch frame step is ~50 small
 * ops, and their dispatch (not the arithmetic) is nearly all of its time. Semantics,
 * float summation order and the stored trie (choices = parent * W + column) are those of
 * the torch step; see step.py's module docstring. Only exactness-preserving shortcuts
 * are taken:
 *   - dead hypotheses (score -inf) and -inf frame columns produce only -inf candidates,
 *     which can never survive, so they are not enumerated;
 *   - a column c whose best possible candidate, max_j s_j + x_c + (largest bonus any
 *     fusion table holds), is below (an actual candidate's score) - theta - slack is
 *     pruned for every hypothesis, so it is not enumerated either (FlexCTC's theta
 *     pruning applied before the expansion instead of after it).
 *   - blank and repeat candidates use the tables' identity column (score 0, same row),
 *     so they are scored and advanced without reading the tables.
 * A fusion model too large for a dense table (a token n-gram over a 1024-piece
 * vocabulary) is read from its NGPU-LM back-off graph instead (FlexCTC §II-D; the
 * arrays of pipeline/lm/backoff_graph.py): the state's explicit arc for the label, found
 * by binary search, else its back-off, down to the root's dense row; the same sums in
 * the same order as BackoffGraph.advance_labels, then alpha * score + beta as
 * fusion.py's GenericLookup computes them; a label that no arc along the state's
 * back-off chain has goes straight to the root row with the chain's back-off sum (a
 * per-state signature, see chain_t); a small memo keeps the lookups already made in the
 * call (the same entries, found again without the search).
 * Viable columns are enumerated best first for the few best (a sorted head) and in any
 * order after it, which can only reorder candidates of exactly equal score.
 * Dead slots are filled the way the torch step leaves them: score -inf, never a parent.
 *
 * Max merge only (the Viterbi recombination); logsumexp stays on the torch path.
 * Built on first use by loop_native.py (through native_build.py) with the system C
 * compiler, loaded by ctypes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define HASH_BASE 1000003LL
#define HASH_MOD 2147483647LL
#define MAX_LOOKUPS 4
#define MAX_SLOTS 1024
/* float32 sums over a few hundred frames round by far less than this (nats) */
#define PRUNE_SLACK 1e-2f
#define VIABLE_HEAD 8
#define PREFETCH_COLUMNS 3  /* the loads of the best few columns overlap with selection */

/* one fusion-table entry: the bonus and the next state's row offset side by side, so
 * the lookup that scores a candidate also brings its next state into the cache */
typedef struct {
    float score;
    int32_t next;
} entry_t;

/* A state's whole back-off chain at a glance (ctc_graph_chains): a signature of the
 * labels of every explicit arc along the chain (one bit per label hash) and the sum of
 * the chain's back-off weights. Most lookups of a CTC search are of labels the context
 * never saw, which end at the root; a clear signature bit says so in one load, with the
 * very sum the walk would have made. */
#define CHAIN_SIG_BITS 192
typedef struct {
    uint64_t sig[CHAIN_SIG_BITS / 64];
    float acc;
    int32_t pad;
} chain_t;

static inline uint32_t chain_bit(int64_t label) {
    return (uint32_t)((((uint64_t)label * 0x9E3779B97F4A7C15ull) >> 32) % CHAIN_SIG_BITS);
}

/* a back-off graph lookup (fusion.py's GenericLookup over a BackoffGraph) */
typedef struct {
    const int64_t *arc_start;   /* [S + 1] CSR offsets; arcs sorted by label per state */
    const int32_t *arc_label, *arc_to;
    const float *arc_w;
    const int32_t *backoff_to, *root_row, *root_to;
    const float *backoff_w, *root_w;
    const chain_t *chains;      /* [S], or NULL: no shortcut (a graph too large for them) */
    int64_t depth;
    float alpha, beta;
} graph_t;

/* chains[s] of every state (see chain_t): the same walk as graph_entry's, recording
 * every arc label instead of searching for one */
void ctc_graph_chains(int64_t S, int64_t depth, const int64_t *arc_start, const int32_t *arc_label,
                      const int32_t *backoff_to, const float *backoff_w, chain_t *chains)
{
    for (int64_t s = 0; s < S; s++) {
        chain_t c;
        memset(&c, 0, sizeof c);
        float acc = 0.0f;
        int64_t cur = s;
        for (int64_t d = 0; d < depth; d++) {
            for (int64_t a = arc_start[cur]; a < arc_start[cur + 1]; a++) {
                const uint32_t bit = chain_bit(arc_label[a]);
                c.sig[bit >> 6] |= (uint64_t)1 << (bit & 63);
            }
            acc = acc + backoff_w[cur];
            cur = backoff_to[cur];
        }
        c.acc = acc;
        chains[s] = c;
    }
}

typedef struct {
    float score;
    int32_t parent, col;
    int64_t pkey;  /* prefix key after this frame: length * HASH_MOD + rolling hash */
    int64_t label; /* the frame's label (the recombination key is (pkey, label)) */
    int64_t lmcol; /* fusion column: LM token id when new, else V (identity) */
} cand_t;

/* x mod (2^31 - 1) for 0 <= x < 2^62 without a division (HASH_MOD is a Mersenne prime) */
static inline int64_t mod_mersenne(int64_t x) {
    x = (x & HASH_MOD) + (x >> 31);
    x = (x & HASH_MOD) + (x >> 31);
    return x >= HASH_MOD ? x - HASH_MOD : x;
}

/* sorted insertion, best first; ties keep the earlier (lower index) candidate first */
static inline void insert_top(cand_t *top, int64_t *n, int64_t cap, cand_t c) {
    int64_t pos = *n;
    if (pos == cap) {
        if (!(c.score > top[cap - 1].score)) return;
        pos = cap - 1;
    } else {
        (*n)++;
    }
    while (pos > 0 && c.score > top[pos - 1].score) {
        top[pos] = top[pos - 1];
        pos--;
    }
    top[pos] = c;
}

/* A direct-mapped memo of back-off graph lookups, (lookup, state, label) -> entry: a
 * hypothesis keeps its LM state over the blank frames between tokens and meets the same
 * few tokens frame after frame, so most lookups repeat one made a frame or two before,
 * and a memo hit (one load) replaces a chain of binary searches. Exact: the entry is the
 * one the search computed. */
#define MEMO_BITS 12
typedef struct {
    int64_t key;
    entry_t e;
} memo_t;

/* One (frame, utterance) pair's view of the search inputs. */
typedef struct {
    const int64_t *tk, *lt;    /* the frame's token ids (NULL: column = id) and LM ids */
    const entry_t *const *tab; /* the fusion tables (NULL: a graph) */
    const graph_t *const *gr;  /* the back-off graphs (NULL: a table) */
    const int64_t *states;     /* [n_lookups, B, K] row offsets (tables) or states (graphs) */
    int64_t n_lookups, B, K, b, V;
    int has_beta_only;
    float beta_only;
    memo_t *memo;              /* back-off graph lookups already made in this call */
} pair_t;

static inline int64_t token_of(const pair_t *p, int64_t c) { return p->tk ? p->tk[c] : c; }

/* the fusion column of column c for a hypothesis whose last label is `last`: its LM id
 * when the token is new (not blank, not a repeat), else the identity column V */
static inline int64_t fusion_column(const pair_t *p, int64_t c, int64_t last) {
    return token_of(p, c) != last ? p->lt[c] : p->V;
}

static entry_t graph_entry(const graph_t *g, int64_t V, int64_t state, int64_t label) {
    float acc = 0.0f;
    int64_t cur = state;
    const uint32_t bit = chain_bit(label);
    if (g->chains && !(g->chains[state].sig[bit >> 6] & ((uint64_t)1 << (bit & 63)))) {
        /* no arc of the chain has this label: the walk below would end at the root */
        acc = g->chains[state].acc;
        cur = -1;
    }
    for (int64_t d = 0; cur >= 0 && d < g->depth; d++) {
        int64_t lo = g->arc_start[cur], hi = g->arc_start[cur + 1];
        const int64_t end = hi;
        while (lo < hi) {
            const int64_t mid = (lo + hi) >> 1;
            if (g->arc_label[mid] < label) lo = mid + 1; else hi = mid;
        }
        if (lo < end && g->arc_label[lo] == label) {
            const float raw = acc + g->arc_w[lo];
            const float scaled = raw * g->alpha;
            entry_t e = {scaled + g->beta, g->arc_to[lo]};
            return e;
        }
        acc = acc + g->backoff_w[cur];
        cur = g->backoff_to[cur];
    }
    const int64_t at = (int64_t)g->root_row[state] * V + label;
    const float raw = g->root_w[at] + acc;
    const float scaled = raw * g->alpha;
    entry_t e = {scaled + g->beta, g->root_to[at]};
    return e;
}

static inline entry_t entry(const pair_t *p, int64_t l, int64_t j, int64_t lmcol) {
    const int64_t st = p->states[(l * p->B + p->b) * p->K + j];
    if (p->gr[l]) {
        const int64_t key = (st * (p->V + 1) + lmcol) * MAX_LOOKUPS + l;
        memo_t *m = p->memo + (((uint64_t)key * 0x9E3779B97F4A7C15ull) >> (64 - MEMO_BITS));
        if (m->key != key) {
            m->key = key;
            m->e = graph_entry(p->gr[l], p->V, st, lmcol);
        }
        return m->e;
    }
    return p->tab[l][st + lmcol];
}

/* eq. 1 for one candidate, summed in the torch step's order. The identity column V
 * (blank, repeat) scores 0 and keeps the row in every table (fusion.py's DenseLookup builds it so),
 * so its lookups, a cache miss each, are skipped: x + 0.0f == x. */
static inline float candidate_score(const pair_t *p, float sj, float xc, int64_t j, int64_t lmcol) {
    float cs = sj + xc;
    if (lmcol == p->V) return cs;
    for (int64_t l = 0; l < p->n_lookups; l++) cs = cs + entry(p, l, j, lmcol).score;
    if (p->has_beta_only) cs = cs + p->beta_only;
    return cs;
}

/* start the fusion-table loads of column c for every live hypothesis (a cache miss each:
 * the tables are tens of MB), so they overlap with other work instead of stalling the
 * expansion one by one */
static inline void prefetch_column(const pair_t *p, const float *sc, const int64_t *la, int64_t c) {
    for (int64_t j = 0; j < p->K; j++) {
        if (sc[j] == -INFINITY) continue;
        const int64_t lmcol = fusion_column(p, c, la[j]);
        if (lmcol == p->V) continue;
        for (int64_t l = 0; l < p->n_lookups; l++)
            if (!p->gr[l]) __builtin_prefetch(&p->tab[l][p->states[(l * p->B + p->b) * p->K + j] + lmcol]);
    }
}

static inline void count_live(float *alive, int64_t b, const float *sc, int64_t K, float weight) {
    if (!alive) return;
    int64_t live = 0;
    for (int64_t r = 0; r < K; r++) live += sc[r] > -INFINITY;
    alive[b] = alive[b] + (float)live * weight;
}

/* slot r of the next beams from candidate cd (its fusion states advanced) */
static inline void keep(const pair_t *p, cand_t cd, int64_t r, int64_t fb, int64_t W, const int64_t *states,
                        float *new_scores, int64_t *new_key, int64_t *new_last,
                        int64_t (*new_states)[MAX_SLOTS], int64_t *choices) {
    const int64_t parent = cd.parent;
    new_scores[r] = cd.score;
    new_key[r] = cd.pkey;
    new_last[r] = cd.label;
    for (int64_t l = 0; l < p->n_lookups; l++)
        new_states[l][r] = cd.score == -INFINITY ? 0
                           : cd.lmcol == p->V ? states[(l * p->B + p->b) * p->K + parent]
                                              : entry(p, l, parent, cd.lmcol).next;
    choices[fb * p->K + r] = parent * W + cd.col;
}

int ctc_beam_loop(
    int64_t S, int64_t B, int64_t K, int64_t W, int64_t V, int64_t M,
    const float *values,      /* [S, B, W] */
    const int64_t *tokens,    /* [S, B, W] token ids, or NULL: column = token id */
    const int64_t *lm_tokens, /* [S, B, W], or [W] when tokens is NULL */
    const float *thresholds,  /* [S, B] theta (inf = no pruning) */
    const float *weights,     /* [S, B] frames a step stands for (alive counting) */
    int64_t n_lookups,
    const entry_t *const *tab,        /* per lookup: [states * (V+1)] (alpha*score (+beta),
                                         next state's row offset), or NULL */
    const graph_t *const *gr,         /* per lookup: a back-off graph, or NULL */
    const float *bonus_max,           /* per lookup: the table's largest entry */
    int has_beta_only, float beta_only, /* no fusion model: beta on new tokens */
    float *scores, int64_t *last, int64_t *key, /* [B, K] in/out */
    int64_t *states,          /* [n_lookups, B, K] in/out (row offsets) */
    int64_t *choices,         /* [S, B, K] out */
    float *alive)             /* [B] in/out, or NULL */
{
    if (n_lookups > MAX_LOOKUPS || M > MAX_SLOTS || K > MAX_SLOTS || M < K) return -1;
    cand_t top[MAX_SLOTS];
    float new_scores[MAX_SLOTS];
    int64_t new_last[MAX_SLOTS], new_key[MAX_SLOTS], new_states[MAX_LOOKUPS][MAX_SLOTS];
    int64_t viable[VIABLE_HEAD], tail[4096];
    if (W > 4096) return -2;
    /* on the heap: the stack already holds ~125 KiB of the arrays above, and a worker
     * thread's stack may be small */
    memo_t *memo = malloc(sizeof(memo_t) << MEMO_BITS);
    if (!memo) return -3;
    for (int64_t i = 0; i < (1 << MEMO_BITS); i++) memo[i].key = -1;
    float bmax = 0.0f;
    for (int64_t l = 0; l < n_lookups; l++) bmax += bonus_max[l] > 0.0f ? bonus_max[l] : 0.0f;
    if (has_beta_only && beta_only > 0.0f) bmax += beta_only;

    /* utterance by utterance (they are independent), so an utterance's frames reuse its
     * own memo entries and cache lines while they are still there */
    for (int64_t b = 0; b < B; b++) {
        for (int64_t s = 0; s < S; s++) {
            const int64_t fb = s * B + b;
            const float *x = values + fb * W;
            const pair_t pr = {tokens ? tokens + fb * W : NULL, tokens ? lm_tokens + fb * W : lm_tokens,
                               tab, gr, states, n_lookups, B, K, b, V, has_beta_only, beta_only, memo};
            const float th = thresholds[fb];
            float *sc = scores + b * K;
            int64_t *la = last + b * K, *ky = key + b * K;
            if (s > 0 && weights[fb] == 0.0f && weights[fb - B] == 0.0f) {
                /* a second padded frame: the first one already merged the hypotheses that
                 * differ only in their last label and left them sorted with a blank last
                 * label; another all-blank frame keeps every hypothesis in its slot */
                for (int64_t r = 0; r < K; r++) choices[fb * K + r] = r * W;
                count_live(alive, b, sc, K, weights[fb]);
                continue;
            }

            /* the best hypothesis and the frame's best column give one actual
             * candidate, a lower bound on the best candidate */
            int64_t jbest = -1;
            float smax = -INFINITY;
            for (int64_t j = 0; j < K; j++)
                if (sc[j] > smax) { smax = sc[j]; jbest = j; }
            /* the frame's best and second-best columns in one pass */
            int64_t cbest = 0;
            float second = -INFINITY;
            for (int64_t c = 1; c < W; c++) {
                const float xc = x[c];
                if (xc > x[cbest]) { second = x[cbest]; cbest = c; }
                else if (xc > second) second = xc;
            }
            prefetch_column(&pr, sc, la, cbest);  /* overlaps with the column selection */
            /* viable columns: the best VIABLE_HEAD sorted best first (head), the rest
             * (tail, each below the head's last) unsorted, so selection costs
             * O(W * VIABLE_HEAD) instead of an O(nv^2) insertion sort over tens of columns */
            int64_t nh = 0, nt = 0;
            float cutoff = -INFINITY;
            if (jbest >= 0 && x[cbest] > -INFINITY) {
                if (isfinite(th)) {
                    const float lower = candidate_score(&pr, sc[jbest], x[cbest], jbest,
                                                        fusion_column(&pr, cbest, la[jbest]));
                    cutoff = lower - th - PRUNE_SLACK - smax - bmax;
                }
                if (!(second > -INFINITY) || second < cutoff) {
                    viable[nh++] = cbest;  /* one viable column (blank runs): no scan */
                } else {
                    for (int64_t c = 0; c < W; c++) {
                        const float xc = x[c];
                        if (!(xc > -INFINITY) || xc < cutoff) continue;
                        if (nh == VIABLE_HEAD) {
                            if (!(xc > x[viable[nh - 1]])) { tail[nt++] = c; continue; }
                            tail[nt++] = viable[--nh];
                        }
                        int64_t p = nh++;
                        while (p > 0 && xc > x[viable[p - 1]]) { viable[p] = viable[p - 1]; p--; }
                        viable[p] = c;
                    }
                }
            }
            for (int64_t v = 1; v < nh && v < PREFETCH_COLUMNS; v++) prefetch_column(&pr, sc, la, viable[v]);

            int64_t n = 0;
            for (int64_t j = 0; j < K && nh; j++) {
                const float sj = sc[j];
                if (sj == -INFINITY) continue;
                const int64_t kj = ky[j], lj = la[j];
                const int64_t h = mod_mersenne(kj);
                for (int64_t v = 0; v < nh + nt; v++) {
                    const int64_t c = v < nh ? viable[v] : tail[v - nh];
                    /* head columns come best first, and every tail column is below the
                     * head's last: once this hypothesis's upper bound can neither survive
                     * theta nor enter the full top-M, no later head column can, and at
                     * the head's end no tail column can either; within the unsorted tail
                     * a failing column only skips itself */
                    if (v <= nh) {  /* a head column, or the bound of the whole tail */
                        const float ub = sj + x[v < nh ? c : viable[nh - 1]] + bmax + PRUNE_SLACK;
                        if (n > 0 && isfinite(th) && ub < top[0].score - th) break;
                        if (n == M && ub < top[M - 1].score) break;
                    }
                    if (v >= nh) {
                        const float ub = sj + x[c] + bmax + PRUNE_SLACK;
                        if (n > 0 && isfinite(th) && ub < top[0].score - th) continue;
                        if (n == M && ub < top[M - 1].score) continue;
                    }
                    const int64_t tok = token_of(&pr, c);
                    const int64_t lmcol = fusion_column(&pr, c, lj);
                    const float cs = candidate_score(&pr, sj, x[c], j, lmcol);
                    if (cs == -INFINITY || (n == M && !(cs > top[M - 1].score))) continue;
                    int64_t ck = kj;
                    if (lmcol != V) ck = mod_mersenne(h * HASH_BASE + tok) + (kj - h + HASH_MOD);
                    cand_t cd = {cs, (int32_t)j, (int32_t)c, ck, tok, lmcol};
                    insert_top(top, &n, M, cd);
                }
            }

            /* theta pruning against the best, recombination into the first (best) member
             * of each key group (max merge), then the best K survivors in order */
            int64_t kept = 0;
            if (M > K) {
                /* top is sorted, so theta cuts a tail, and a key group's first member
                 * survives: a candidate is compared with the survivors before it only,
                 * and the scan stops at K of them (same survivors as the masking below) */
                const float cut = n ? top[0].score - th : 0.0f;
                for (int64_t i = 0; i < n && kept < K; i++) {
                    const cand_t cd = top[i];
                    if (cd.score == -INFINITY || cd.score < cut) break;
                    int dup = 0;
                    for (int64_t p = 0; p < kept && !dup; p++) dup = new_key[p] == cd.pkey && new_last[p] == cd.label;
                    if (dup) continue;
                    keep(&pr, cd, kept, fb, W, states, new_scores, new_key, new_last, new_states, choices);
                    kept++;
                }
            } else {
                /* M == K: positions kept, as the torch step (masked slots stay) */
                for (int64_t i = 0; i < n; i++) {
                    if (top[i].score == -INFINITY) continue;
                    int dup = top[i].score < top[0].score - th;
                    for (int64_t p = 0; p < i && !dup; p++)
                        dup = top[p].pkey == top[i].pkey && top[p].label == top[i].label;
                    if (dup) top[i].score = -INFINITY;
                }
                for (; kept < n && kept < K; kept++)
                    keep(&pr, top[kept], kept, fb, W, states, new_scores, new_key, new_last, new_states, choices);
            }
            for (int64_t r = 0; r < K; r++) {
                if (r >= kept) {
                    new_scores[r] = -INFINITY;
                    new_key[r] = 0;
                    new_last[r] = 0;
                    for (int64_t l = 0; l < n_lookups; l++) new_states[l][r] = 0;
                    choices[fb * K + r] = r * W;
                }
                sc[r] = new_scores[r];
                ky[r] = new_key[r];
                la[r] = new_last[r];
                for (int64_t l = 0; l < n_lookups; l++) states[(l * B + b) * K + r] = new_states[l][r];
            }
            count_live(alive, b, sc, K, weights[fb]);
        }
    }
    free(memo);
    return 0;
}

/* Back-pointers of the stored trie ("Pushing the Limits of Beam Search Decoding for
 * Transducer-based ASR models", §2.1) from the final slots.
 * labels[s, b, k] = tokens[s, b, choices % W] (or the column), parents = choices / W.
 * out: [B, n, S] frame labels of each selected hypothesis. Returns -1 (out untouched)
 * when n exceeds MAX_SLOTS. */
int ctc_backtrack(int64_t S, int64_t B, int64_t K, int64_t W, int64_t n,
                  const int64_t *choices, const int64_t *tokens, const int64_t *slots,
                  int64_t *out)
{
    int64_t cur[MAX_SLOTS];
    if (n > MAX_SLOTS) return -1;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < n; i++) cur[i] = slots[b * n + i];
        /* the n hypotheses step back together: each chain of loads depends on the one
         * before it, and n independent chains overlap their latencies */
        for (int64_t s = S - 1; s >= 0; s--) {
            const int64_t *ch_s = choices + (s * B + b) * K;
            const int64_t *tk_s = tokens ? tokens + (s * B + b) * W : NULL;
            for (int64_t i = 0; i < n; i++) {
                const int64_t ch = ch_s[cur[i]];
                const int64_t col = ch % W;
                out[(b * n + i) * S + s] = tk_s ? tk_s[col] : col;
                cur[i] = ch / W;
            }
        }
    }    return 0;
}

/* FLToP ("FLToP CTC: Frame-Level Token Pruning via Relative Threshold", Algorithm 1) for every frame of a batch, straight from the model's
 * log-probs (rows[b]: utterance b's [lengths[b], V+1] frames, contiguous; a padded batch
 * or each utterance's own array, so a batch needs no padded copy) into the search's
 * frame-major [T, B, N] layout: the top-N tokens
 * of each frame, best first, those below R x the frame's best at -inf. Blank becomes
 * token 0 (the search's internal ids). Frames at t >= length are frozen: blank at log-prob
 * 0, the rest -inf. Same result as frames.py's prepare_frames + flop.prune_frame (token ids of
 * -inf slots aside, which the search never reads).
 * A frame's V+1 columns are the largest data of the search, so they are read once at
 * vector width (SSE2 intrinsics on x86-64, GCC/clang vector extensions elsewhere; no build
 * flag) for the maximum of each block of FLOP_BLOCK columns. A block is read again only
 * if its maximum reaches the ratio's floor, a lower bound on the frame's N-th best value
 * (the smallest of the maxima of N runs of blocks) and, once N columns are kept, exceeds
 * the N-th of them; its columns that reach the limit come out of vector compares as a bit mask,
 * in column order. Max and compare are exact, so the result is the plain scan's, ties
 * included (the earlier column first). */
#define FLOP_BLOCK 32
#if !defined(__SSE2__)
typedef float f4_t __attribute__((vector_size(16)));
typedef int32_t i4_t __attribute__((vector_size(16)));
static inline f4_t load4(const float *p) { f4_t v; memcpy(&v, p, sizeof v); return v; }
#endif

/* the largest of the FLOP_BLOCK floats at p (max is exact: any order gives it) */
static inline float block_max(const float *p) {
#if defined(__SSE2__)
    __m128 a = _mm_max_ps(_mm_loadu_ps(p), _mm_loadu_ps(p + 4));
    __m128 c = _mm_max_ps(_mm_loadu_ps(p + 8), _mm_loadu_ps(p + 12));
    for (int i = 16; i < FLOP_BLOCK; i += 8) {
        a = _mm_max_ps(a, _mm_loadu_ps(p + i));
        c = _mm_max_ps(c, _mm_loadu_ps(p + i + 4));
    }
    a = _mm_max_ps(a, c);
    a = _mm_max_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(1, 0, 3, 2)));
    a = _mm_max_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(a);
#else
    f4_t a = load4(p), c = load4(p + 4);
    for (int i = 8; i < FLOP_BLOCK; i += 8) {
        const f4_t u = load4(p + i), w = load4(p + i + 4);
        i4_t g = u > a; a = (f4_t)(((i4_t)u & g) | ((i4_t)a & ~g));
        g = w > c; c = (f4_t)(((i4_t)w & g) | ((i4_t)c & ~g));
    }
    const i4_t g = c > a; a = (f4_t)(((i4_t)c & g) | ((i4_t)a & ~g));
    const float m = a[0] > a[1] ? a[0] : a[1], m2 = a[2] > a[3] ? a[2] : a[3];
    return m2 > m ? m2 : m;
#endif
}

/* bit i set where p[i] >= lim and p[i] > -inf, for the FLOP_BLOCK floats at p */
static inline uint32_t block_mask(const float *p, float lim) {
    uint32_t mask = 0;
#if defined(__SSE2__)
    const __m128 l = _mm_set1_ps(lim), ninf = _mm_set1_ps(-INFINITY);
    for (int i = 0; i < FLOP_BLOCK; i += 4) {
        const __m128 v = _mm_loadu_ps(p + i);
        const __m128 ok = _mm_and_ps(_mm_cmpge_ps(v, l), _mm_cmpgt_ps(v, ninf));
        mask |= (uint32_t)_mm_movemask_ps(ok) << i;
    }
#else
    for (int i = 0; i < FLOP_BLOCK; i++) mask |= (uint32_t)(p[i] >= lim && p[i] > -INFINITY) << i;
#endif
    return mask;
}

void ctc_flop_prune(int64_t B, int64_t T, int64_t V1, int64_t N, int64_t blank,
                    const float *const *rows, const int64_t *lengths, int has_ratio, float log_ratio,
                    float *out_values, int64_t *out_tokens)
{
    const int64_t nb = (V1 + FLOP_BLOCK - 1) / FLOP_BLOCK;
    float bm[nb];  /* each block's maximum */
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            float *ov = out_values + (t * B + b) * N;
            int64_t *ot = out_tokens + (t * B + b) * N;
            for (int64_t i = 0; i < N; i++) { ov[i] = -INFINITY; ot[i] = i < V1 ? i : 0; }
            if (t >= lengths[b]) { ov[0] = 0.0f; ot[0] = 0; continue; }
            const float *x = rows[b] + t * V1;
            float best = -INFINITY;
            for (int64_t k = 0; k < nb; k++) {
                const int64_t e0 = k * FLOP_BLOCK;
                float m = -INFINITY;
                if (e0 + FLOP_BLOCK <= V1) {
                    m = block_max(x + e0);
                } else {
                    for (int64_t e = e0; e < V1; e++) m = x[e] > m ? x[e] : m;
                }
                bm[k] = m;
                best = m > best ? m : best;
            }
            /* a lower bound on the frame's N-th best value, to skip the blocks below
             * it: cut the blocks into N runs; each run's maximum is a different column,
             * so N columns reach the smallest of them (no selection, no branch) */
            const float floor_v = has_ratio ? best + log_ratio : -INFINITY;
            float lim = floor_v;
            if (nb >= N) {
                float bound = INFINITY;
                for (int64_t g = 0; g < N; g++) {
                    float gm = -INFINITY;
                    for (int64_t k = g * nb / N; k < (g + 1) * nb / N; k++) gm = bm[k] > gm ? bm[k] : gm;
                    bound = gm < bound ? gm : bound;
                }
                if (bound > lim) lim = bound;
            }
            int64_t n = 0;
            /* the blocks that reach the limit, 64 at a time, as a bit mask: one branch per
             * block that passes instead of a poorly predicted one for every block */
            for (int64_t k0 = 0; k0 < nb; k0 += 64) {
                const int64_t k1 = k0 + 64 < nb ? k0 + 64 : nb;
                uint64_t pass = 0;
                for (int64_t k = k0; k < k1; k++) pass |= (uint64_t)(bm[k] >= lim) << (k - k0);
                while (pass) {
                    const int64_t k = k0 + __builtin_ctzll(pass);
                    pass &= pass - 1;
                    /* N kept already: only a column above the N-th can enter (ties go to the
                     * earlier column, which is in) */
                    if (n == N) {
                        if (!(bm[k] > ov[N - 1])) continue;
                        if (ov[N - 1] > lim) lim = ov[N - 1];
                    }
                    const int64_t e0 = k * FLOP_BLOCK;
                    const int64_t e1 = e0 + FLOP_BLOCK < V1 ? e0 + FLOP_BLOCK : V1;
                    /* the columns that reach the limit, as a bit mask (vector compares), so
                     * the column-by-column work is one iteration per kept candidate */
                    uint32_t mask = 0;
                    if (e1 - e0 == FLOP_BLOCK) {
                        mask = block_mask(x + e0, lim);
                    } else {
                        for (int64_t e = e0; e < e1; e++) mask |= (uint32_t)(x[e] >= lim && x[e] > -INFINITY) << (e - e0);
                    }
                    while (mask) {
                        const int64_t e = e0 + __builtin_ctz(mask);
                        mask &= mask - 1;
                        const float v = x[e];
                        if (n == N && !(v > ov[N - 1])) continue;
                        const int64_t id = e == blank ? 0 : (e < blank ? e + 1 : e);
                        int64_t pos = n < N ? n++ : N - 1;
                        while (pos > 0 && v > ov[pos - 1]) { ov[pos] = ov[pos - 1]; ot[pos] = ot[pos - 1]; pos--; }
                        ov[pos] = v;
                        ot[pos] = id;
                    }
                }
            }
        }
    }
}

/* Frame compression of FLToP frames, max merge (frames.py's compress_runs): a frame that
 * keeps one token, the same one the frame before kept alone, joins that frame's step,
 * whose column-0 score is the sum of its frames' (in time order). Steps are left-aligned
 * per utterance; steps past an utterance's count are frozen (blank 0, others -inf, theta
 * inf, weight 0). Writes the step inputs [T, B, N] (values, tokens, LM ids: V for blank),
 * thresholds and weights [T, B], and frame_map [B, T] (padding: the returned step count). */
int64_t ctc_flop_compress(int64_t T, int64_t B, int64_t N, int64_t V1,
                          const float *values, const int64_t *tokens, const int64_t *lengths,
                          float theta, float *out_v, int64_t *out_t, int64_t *out_lm,
                          float *out_th, float *out_w, int64_t *frame_map)
{
    int64_t steps = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t step = -1, prev_tok = -1;
        const int64_t len = lengths[b] < T ? lengths[b] : T;
        for (int64_t t = 0; t < len; t++) {
            const float *v = values + (t * B + b) * N;
            const int64_t *k = tokens + (t * B + b) * N;
            const int single = N == 1 || v[1] == -INFINITY;
            const int64_t tok = single ? k[0] : -1;
            if (t == 0 || !single || tok != prev_tok) {
                step++;
                float *ov = out_v + (step * B + b) * N;
                int64_t *ot = out_t + (step * B + b) * N, *ol = out_lm + (step * B + b) * N;
                for (int64_t i = 0; i < N; i++) {
                    ov[i] = v[i];
                    ot[i] = k[i];
                    ol[i] = k[i] == 0 ? V1 - 1 : k[i] - 1;
                }
                ov[0] = 0.0f + v[0];
                out_th[step * B + b] = theta;
                out_w[step * B + b] = 1.0f;
            } else {
                out_v[(step * B + b) * N] += v[0];
                out_w[step * B + b] += 1.0f;
            }
            prev_tok = tok;
            frame_map[b * T + t] = step;
        }
        if (step + 1 > steps) steps = step + 1;
        for (int64_t s = step + 1; s < T; s++) {
            float *ov = out_v + (s * B + b) * N;
            int64_t *ot = out_t + (s * B + b) * N, *ol = out_lm + (s * B + b) * N;
            for (int64_t i = 0; i < N; i++) { ov[i] = i == 0 ? 0.0f : -INFINITY; ot[i] = 0; ol[i] = V1 - 1; }
            out_th[s * B + b] = INFINITY;
            out_w[s * B + b] = 0.0f;
        }
    }
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = lengths[b] < T ? lengths[b] : T;
        for (int64_t t = len; t < T; t++) frame_map[b * T + t] = steps;
    }
    return steps;
}

/* Frame alignments and emitted tokens of the selected hypotheses (state.py's
 * trie_alignments): steps back to frames through frame_map (padding -> blank), internal ids back
 * to the model's (blank moved from column 0 to `blank`), then a token is emitted at each
 * frame whose label is not blank and differs from the frame before. Hypotheses with
 * finite[b * n + i] == 0 emit nothing. Writes out_align [B, n, T], out_counts [B * n]
 * and the emitted tokens and frames, concatenated in (b, i) order. */
void ctc_alignments(int64_t B, int64_t n, int64_t S, int64_t T, const int64_t *align_steps,
                    const int64_t *frame_map, int64_t blank, const uint8_t *finite,
                    int64_t *out_align, int64_t *out_counts, int64_t *out_tokens, int64_t *out_frames)
{
    int64_t at = 0;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < n; i++) {
            const int64_t *src = align_steps + (b * n + i) * S;
            int64_t *dst = out_align + (b * n + i) * T;
            int64_t prev = blank, count = 0;
            for (int64_t t = 0; t < T; t++) {
                int64_t step = frame_map ? frame_map[b * T + t] : t;
                int64_t lab = step < S ? src[step] : 0;
                lab = lab == 0 ? blank : (lab <= blank ? lab - 1 : lab);
                dst[t] = lab;
                if (finite[b * n + i] && lab != blank && lab != prev) {
                    out_tokens[at] = lab;
                    out_frames[at] = t;
                    at++;
                    count++;
                }
                prev = lab;
            }
            out_counts[b * n + i] = count;
        }
    }
}
