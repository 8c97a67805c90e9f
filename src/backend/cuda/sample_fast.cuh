/* sample_fast.cuh - the sampler's faster draw (sample.cu's header: "The faster draw"; DRAMA_CUDA_SAMPLE,
 * default on). Included by sample.cu only, after its helpers (logit_key, block_scan's margins,
 * draw_sorted). Every function is called by all threads of the block unless it says warp 0. */
#ifndef DRAMA_BACKEND_CUDA_SAMPLE_FAST_CUH
#define DRAMA_BACKEND_CUDA_SAMPLE_FAST_CUH

#define TOP_CAP 1024 /* the top-k path holds at most this many keys (else the full sort runs) */
#define GUESS_K 32    /* the nucleus list without top-k: one warp's sort */
#ifndef SAMPLE_STAT
#define SAMPLE_STAT(what) /* tests/host_emu counts the paths taken */
#endif
#define NO_INDEX 0x7FFFFFFF

struct fast_smem {
    sample_smem S;
    unsigned long long *top;  /* [TOP_CAP] the selected keys, then sorted (rank order) */
    unsigned long long *maxk; /* [32] each warp's largest key */
    double *zpart;            /* [32] each warp's part of the untempered total Z */
    int *hist;                /* [3][256] the radix select's digit counts, rotating */
    int *sel;                 /* [4] sel[3]: keys collected */
    float *gm, *gs;           /* [32] each: a warp's largest logit and sum of __expf(l - that): the gate's estimate */
};

/* Which of the logits a block keeps: key build / the state of S.keys between the two semantic draws. */
struct draw_state {
    int m;      /* valid candidates; 0: S.keys not built yet */
    int sorted; /* S.keys in rank order (plain layout) */
    int listed; /* F.top[0..GUESS_K) holds the top GUESS_K keys in rank order and F.zpart Z (the nucleus list) */
};

/* The sorts' shared-memory layout: an XOR of the low 4 bits of a key's slot by bits 4..6, chosen so that
 * each half-warp's 8-byte accesses hit 16 different bank pairs for every register window below
 * (window bit base 0..3, checked by hand; >= 4 is conflict-free anyway). A bijection on any [0, 16 j). */
__device__ __forceinline__ int swz(int i) { return i ^ ((i >> 4 & 1) * 3) ^ ((i >> 5 & 1) * 6) ^ ((i >> 6 & 1) * 9); }

/* One bitonic stage inside a thread's 8 registers: the pair differs in index bit wb + C. */
template <int C>
__device__ __forceinline__ void reg_stage(unsigned long long (&v)[8], int base, int wb, int p) {
#pragma unroll
    for (int e = 0; e < 8; e++)
        if (!(e & (1 << C))) {
            const int f = e | (1 << C), i = base | (e << wb);
            const bool desc = ((i >> p) & 1) == 0;
            const unsigned long long x = v[e], y = v[f];
            const bool s = desc ? x < y : x > y; /* the old sort's exchange rule */
            v[e] = s ? y : x;
            v[f] = s ? x : y;
        }
}

/* The bitonic network of bitonic_sort_smem (same compare-exchanges, same order per element pair, so the
 * same result: the keys are distinct) on a[0 .. 2^L), L >= 3, a in swz layout on entry, plain (rank
 * order) on return. Thread t holds the 8 keys whose index bits wb..wb+2 vary (its other bits = t): all
 * stages of a phase whose bit lies in that window run in registers, so each shared-memory round trip
 * (one barrier) serves up to 3 stages: 1 + sum_{p=4..L} ceil(p / 3) trips, 33 at L = 13 (91 passes
 * before), 20 at L = 10 (55), plus one barrier before the plain final store. DEFECT: the last stage skipped (the contract's control). */
template <int DEFECT>
__device__ __noinline__ void window_sort(unsigned long long *a, int L) {
    const int tid = threadIdx.x;
    const bool act = tid < (1 << (L - 3));
    unsigned long long v[8];
    int cur = -1, cbase = 0;
    for (int p = 1; p <= L; p++)
        for (int top = p - 1; top >= 0; top -= 3) {
            const int wb = top > 2 ? top - 2 : 0, base = ((tid >> wb) << (wb + 3)) | (tid & ((1 << wb) - 1));
            if (wb != cur) {
                if (cur >= 0) {
                    if (act)
#pragma unroll
                        for (int e = 0; e < 8; e++) a[swz(cbase | (e << cur))] = v[e];
                    __syncthreads();
                }
                if (act)
#pragma unroll
                    for (int e = 0; e < 8; e++) v[e] = a[swz(base | (e << wb))];
                cur = wb, cbase = base;
            }
            if (act)
                for (int b = top; b >= wb; b--) {
                    if (DEFECT && p == L && b == 0) continue;
                    if (b - wb == 2) reg_stage<2>(v, base, wb, p);
                    else if (b - wb == 1) reg_stage<1>(v, base, wb, p);
                    else reg_stage<0>(v, base, wb, p);
                }
        }
    __syncthreads(); /* the plain layout overlaps other threads' swizzled slots of the last window */
    if (act)
#pragma unroll
        for (int e = 0; e < 8; e++) a[cbase | (e << cur)] = v[e];
    __syncthreads();
}

/* The same network over 32 keys, one per lane of a warp (shuffles, no barrier): lane r gets rank r. */
template <int DEFECT>
__device__ __forceinline__ unsigned long long warp_sort(unsigned long long v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 2; k <= 32; k <<= 1)
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            if (DEFECT && k == 32 && j == 1) continue;
            const unsigned long long o = __shfl_xor_sync(0xFFFFFFFFu, v, j);
            const bool desc = (lane & k) == 0, lower = (lane & j) == 0;
            v = lower == desc ? (v > o ? v : o) : (v < o ? v : o);
        }
    return v;
}

/* The k largest of the n2 keys (1 <= k < number of valid keys) into top[swz(0 .. k)) in some order,
 * zeros at top[swz(k .. k2)): a radix select on the 64-bit key, 8 bits a round from the top (the
 * sign/exponent byte first); bits 31..13 of every valid key are ones (index < 8192), so after the
 * four logit rounds the index's 13 bits take two more (exact ties only). A round ends early when the
 * chosen digit's keys are exactly the ones still needed. Every warp finds the digit itself from the
 * counts (the same integers: the same answer), so a round costs one barrier; the counts rotate over
 * three buffers (the one zeroed in round r was last read in round r - 2, before round r - 1's
 * barrier). hist[0][] holds round 0's counts (the key build's), hist[1..2][] and sel[3] are zero. */
__device__ void select_top(const unsigned long long *keys, int n2, int k, int k2, const fast_smem &F) {
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, iters = (n2 + nt - 1) / nt;
    unsigned long long T = 0, mask = 0; /* the chosen digits so far; mask: their bits (contiguous from 63) */
    int need = k;
    for (int r = 0;; r++) {
        const int sh = r < 4 ? 56 - 8 * r : r == 4 ? 5 : 0, nb = r == 5 ? 5 : 8;
        const unsigned dmask = (1u << nb) - 1;
        int *h = F.hist + (r % 3) * 256;
        if (r == 4) T |= 0x7FFFFull << 13, mask |= 0x7FFFFull << 13;
        if (r > 0) {
            for (int j = tid; j < 256; j += nt) F.hist[((r + 1) % 3) * 256 + j] = 0;
            for (int it = 0; it < iters; it++) {
                const int i = tid + it * nt;
                const unsigned long long key = i < n2 ? keys[i] : 0;
                const bool in = key != 0 && (key & mask) == T;
                const unsigned d = in ? (unsigned)(key >> sh) & dmask : 0xFFFFFFFFu;
                const unsigned peers = __match_any_sync(0xFFFFFFFFu, d); /* one atomic per digit and warp */
                if (in && lane == __ffs(peers) - 1) atomicAdd(&h[d], __popc(peers));
            }
            __syncthreads();
        }
        /* lane l: digits from the top, per of them; the one where the count passes need */
        const int per = (1 << nb) >> 5;
        int c[8], tot = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            c[j] = j < per ? h[(int)dmask - (lane * per + j)] : 0;
            tot += c[j];
        }
        int inc = tot;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int o = __shfl_up_sync(0xFFFFFFFFu, inc, off);
            if (lane >= off) inc += o;
        }
        int acc = inc - tot, fd = -1, fneed = 0, fcnt = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (j < per && acc < need && acc + c[j] >= need) {
                fd = (int)dmask - (lane * per + j);
                fneed = need - acc;
                fcnt = c[j];
            }
            acc += c[j];
        }
        const int src = __ffs(__ballot_sync(0xFFFFFFFFu, fd >= 0)) - 1; /* exactly one lane */
        fd = __shfl_sync(0xFFFFFFFFu, fd, src);
        fneed = __shfl_sync(0xFFFFFFFFu, fneed, src);
        fcnt = __shfl_sync(0xFFFFFFFFu, fcnt, src);
        T |= (unsigned long long)(unsigned)fd << sh;
        mask |= (unsigned long long)dmask << sh;
        need = fneed;
        if (fcnt == need || r == 5) break; /* r == 5: the whole key, a single one */
    }
    /* the keys above the chosen prefix and all of its own: exactly k */
    for (int it = 0; it < iters; it++) {
        const int i = tid + it * nt;
        const unsigned long long key = i < n2 ? keys[i] : 0;
        const bool s = key != 0 && (key & mask) >= T;
        const unsigned bal = __ballot_sync(0xFFFFFFFFu, s);
        int base = 0;
        if (lane == 0 && bal) base = atomicAdd(&F.sel[3], __popc(bal));
        base = __shfl_sync(0xFFFFFFFFu, base, 0);
        if (s) F.top[swz(base + __popc(bal & ((1u << lane) - 1)))] = key;
    }
    for (int i = k + tid; i < k2; i += nt) F.top[swz(i)] = 0;
    __syncthreads();
}

/* Inclusive prefix sums P[0..n) of q by one warp (each lane a run in order, then the runs' totals by
 * shuffles); returns the total in every lane. Warp 0 only. */
__device__ double warp_scan(const double *q, int n, double *P) {
    const int lane = threadIdx.x & 31, c = (n + 31) >> 5, b0 = lane * c, b1 = b0 + c < n ? b0 + c : n;
    const double v = warp_incl_scan(run_scan(q, b0, b1, P)); /* block_scan's first two steps */
    double excl = __shfl_up_sync(0xFFFFFFFFu, v, 1); /* a move, no rounding */
    if (lane == 0) excl = 0;
    for (int i = b0; i < b1; i++) P[i] = excl + P[i];
    const double total = __shfl_sync(0xFFFFFFFFu, v, 31);
    __syncwarp();
    return total;
}

__device__ __forceinline__ int warp_min(int x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const int o = __shfl_xor_sync(0xFFFFFFFFu, x, off);
        x = o < x ? o : x;
    }
    return x;
}

/* Warp 0: the draw from the top-k list F.top[0..k) in rank order (k < m), with Z the untempered
 * total over all m candidates in F.zpart (when top_p < 1). The nucleus is decided as fast_top_p does
 * but only over the cuts that can bind (s < k: a later one leaves kept = k); the pick as fast_pick, or
 * lane 0's sequential walk as the CPU's (it needs only the kept prefix). bound = 0: no top-k binds
 * (top_k 0 or >= k), the list is the nucleus guess and a cut beyond it is not decided here. Returns -1
 * when the nucleus is open within the margin or not inside the list: the caller then sorts everything
 * and runs draw_sorted. */
__device__ int warp_top_draw(const float *logits, int m, int k, int bound, float x0, const draw_spec &sp, double u,
                             const fast_smem &F) {
    const sample_smem &S = F.S;
    const int lane = threadIdx.x & 31;
    int kept = k;
    if (sp.top_p < 1.0f) {
        double Z = F.zpart[lane];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) Z += __shfl_xor_sync(0xFFFFFFFFu, Z, off);
        if (!(Z > 0) || !isfinite(Z)) return -1;
        for (int r = lane; r < k; r += 32)
            S.q[r] = (double)dr_expf_det(fdiv(fsub(logits[key_index(F.top[r])], x0), 1.0f));
        __syncwarp();
        warp_scan(S.q, k, S.qz);
        const double top_p = (double)sp.top_p;
        /* bound (top_k = k): cuts past hi leave kept = k; else (the nucleus list, k < m) the cut must
         * fall inside the list: kept = s + 1 <= k (keep) or s <= k - 1 (drop, P_k is not listed) */
        const int keep = sp.keep_crossing, lo = keep ? 0 : 1, hi = keep && bound ? k - 2 : k - 1;
        int t = NO_INDEX, nf = NO_INDEX;
        for (int s2 = lo + lane; s2 <= hi; s2 += 32) { /* fast_top_p's decide */
            const double E = S.qz[s2] / Z, B = 2 * sum_margin(m + s2, E);
            const int d = (keep ? E - B >= top_p : E - B > top_p) ? 1 : E + B < top_p ? 0 : -1;
            if (d == 1 && s2 < t) t = s2;
            if (d != 0 && s2 < nf) nf = s2;
        }
        t = warp_min(t), nf = warp_min(nf);
        if (nf != NO_INDEX) {
            if (nf != t) return -1;
            kept = keep ? t + 1 : t;
        } else if (!bound) return -1; /* the nucleus reaches past the list */
    }
    for (int r = lane; r < kept; r += 32)
        S.q[r] = (double)dr_expf_det(fdiv(fsub(logits[key_index(F.top[r])], x0), sp.temperature));
    __syncwarp();
    const double W = warp_scan(S.q, kept, S.qz);
    if (W > 0 && isfinite(W)) { /* fast_pick's decide */
        const double tgt = u * W, bt = 2 * sum_margin(kept, tgt);
        int t = NO_INDEX, nf = NO_INDEX;
        for (int r = lane; r < kept; r += 32) {
            const double A = S.qz[r], ba = 2 * sum_margin(r, A);
            const int d = A - ba > tgt + bt ? 1 : A + ba < tgt - bt ? 0 : -1;
            if (d == 1 && r < t) t = r;
            if (d != 0 && r < nf) nf = r;
        }
        t = warp_min(t), nf = warp_min(nf);
        if (nf == NO_INDEX) return key_index(F.top[kept - 1]);
        if (nf == t) return key_index(F.top[t]);
    }
    int out = 0;
    if (lane == 0) { /* the CPU's walk, in order */
        double target = u * seq_sum(S.q, kept), acc = 0;
        out = key_index(F.top[kept - 1]); /* rounding left none: the last survivor */
        for (int r = 0; r < kept; r++) {
            acc += S.q[r];
            if (target < acc) {
                out = key_index(F.top[r]);
                break;
            }
        }
    }
    return __shfl_sync(0xFFFFFFFFu, out, 0);
}

/* One draw over logits[0..n) (dr_sample) like block_draw, n2 >= 8: the key build (first call of a
 * block only: ds carries the keys to the redraw), then the top-k path when top_k < m (<= TOP_CAP),
 * or (no binding top-k, a nucleus the gate estimates small) the nucleus list of GUESS_K keys, else
 * (or when the list's nucleus is open or longer) the windowed full sort and draw_sorted. V (sample.cu's
 * SV_*): 1 the real draw, 2 a sort that skips its last stage, 3 a top-k list with the k-th key
 * replaced by the (k+1)-th, 4 the real draw without the nucleus list. */
template <int V>
__device__ int fast_draw(const float *logits, int n, int n2, const draw_spec &sp, double u, const fast_smem &F,
                         draw_state &ds, int *err, int *arg) {
    const sample_smem &S = F.S;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, w = tid >> 5, iters = (n2 + nt - 1) / nt;
    const bool fresh = ds.m == 0;
    const int k = sp.top_k, ks = V == 3 ? k + 1 : k; /* ks: the keys the list selects */
    const bool try_top = fresh && k > 0 && ks <= TOP_CAP && !sp.sequential && sp.temperature > 0.0f;
    /* the nucleus list: no binding top-k, a nucleus; tried when the gate estimates it small */
    const bool nucleus = (k == 0 || k > TOP_CAP) && sp.top_p < 1.0f && !sp.sequential && sp.temperature > 0.0f;
    const bool want_guess = fresh && nucleus && V != SV_TOPK_DEFECT && V != SV_NOLIST;
    if (fresh) {
        if (tid == 0) {
            S.bad[0] = 0x7FFFFFFF; /* lowest index of a NaN or +inf */
            S.bad[1] = 0;          /* valid candidates */
            F.sel[3] = 0;
        }
        if (try_top || want_guess)
            for (int i = tid; i < 768; i += nt) F.hist[i] = 0;
        __syncthreads();
        int valid = 0;
        unsigned long long best = 0;
        float lmax = -INFINITY, lsum = 0; /* the gate's estimate (want_guess): this warp's max, then sum */
#pragma unroll
        for (int it = 0; it < 8; it++) {
            if (it >= iters) continue; /* uniform */
            const int i = tid + it * nt;
            unsigned long long key = 0;
            if (i < n) {
                const float l = logits[i];
                if (isnan(l) || (isinf(l) && l > 0)) atomicMin(&S.bad[0], i);
                else if (!isinf(l)) {
                    key = logit_key(l, i);
                    valid++;
                    lmax = l > lmax ? l : lmax;
                }
            }
            if (i < n2) S.keys[swz(i)] = key;
            best = key > best ? key : best;
            if (try_top || want_guess) { /* the radix select's round 0: the top byte */
                const unsigned d = key ? (unsigned)(key >> 56) : 0xFFFFFFFFu;
                const unsigned peers = __match_any_sync(0xFFFFFFFFu, d);
                if (key && lane == __ffs(peers) - 1) atomicAdd(&F.hist[d], __popc(peers));
            }
        }
        atomicAdd(&S.bad[1], valid);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const unsigned long long o = __shfl_xor_sync(0xFFFFFFFFu, best, off);
            best = o > best ? o : best;
        }
        if (lane == 0) F.maxk[w] = best;
        if (want_guess) { /* an estimate only (it picks a path, both exact): fast expf, any order */
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const float o = __shfl_xor_sync(0xFFFFFFFFu, lmax, off);
                lmax = o > lmax ? o : lmax;
            }
            for (int i = tid; i < n; i += nt) {
                const float l = logits[i];
                if (!isinf(l) && !isnan(l)) lsum += __expf(l - lmax);
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) lsum += __shfl_xor_sync(0xFFFFFFFFu, lsum, off);
            if (lane == 0) F.gm[w] = lmax, F.gs[w] = lsum;
        }
        __syncthreads();
        if (S.bad[0] != 0x7FFFFFFF) {
            *arg = S.bad[0];
            *err = isnan(logits[S.bad[0]]) ? DR_CUDA_ERR_LOGIT_NAN : DR_CUDA_ERR_LOGIT_INF;
            return -1;
        }
        if (S.bad[1] == 0) {
            *err = DR_CUDA_ERR_EXCLUDED;
            *arg = 0;
            return -1;
        }
        ds.m = S.bad[1];
        ds.sorted = 0;
        ds.listed = 0;
    }
    const int m = ds.m;
    unsigned long long maxkey = 0; /* the first maximum: rank 0 */
    if (ds.sorted) maxkey = S.keys[0];
    else
        for (int j = 0; j < nt / 32; j++) maxkey = F.maxk[j] > maxkey ? F.maxk[j] : maxkey;
    if (sp.temperature <= 0.0f) return key_index(maxkey);
    bool guess = false;
    if (want_guess && GUESS_K < m) { /* Z (in units of the largest weight) small enough for the list to hold the nucleus */
        const float xf = logits[key_index(maxkey)];
        float z = 0;
        for (int j = 0; j < nt / 32; j++) z += F.gs[j] * __expf(F.gm[j] - xf); /* every thread the same */
        guess = z * sp.top_p < 0.875f * GUESS_K;
    }
    if (!fresh && nucleus && ds.listed && !ds.sorted) { /* the redraw: the first draw's list and Z */
        int r = 0;
        if (tid < 32) {
            r = warp_top_draw(logits, m, GUESS_K, 0, logits[key_index(maxkey)], sp, u, F);
            if (lane == 0) *S.result = r;
        }
        __syncthreads();
        r = *S.result; /* written again only past draw_sorted's barriers */
        if (tid == 0) SAMPLE_STAT(r >= 0 ? "redraw from the list" : "redraw list fell back");
        if (r >= 0) return r;
    }
    if ((try_top && k < m) || guess) {
        const int kl = guess ? GUESS_K : k, kls = guess ? GUESS_K : ks; /* the list's draw size, its selection */
        const float x0 = logits[key_index(maxkey)]; /* draw_sorted's x0 */
        if (sp.top_p < 1.0f) { /* this thread's part of Z (any order: the margin holds for all) */
            double z = 0;
            for (int i = tid; i < n; i += nt) { /* the build checked them: finite or -inf (excluded) */
                const float l = logits[i];
                if (!isinf(l)) z += (double)dr_expf_det(fdiv(fsub(l, x0), 1.0f));
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) z += __shfl_xor_sync(0xFFFFFFFFu, z, off);
            if (lane == 0) F.zpart[w] = z; /* read after select_top's barriers */
        }
        const int k2 = kls <= 32 ? 32 : 1 << (32 - __clz(kls - 1));
        select_top(S.keys, n2, kls, k2, F);
        if (k2 > 32) window_sort<V == 2>(F.top, 31 - __clz(k2));
        if (tid < 32) {
            if (k2 == 32) {
                F.top[lane] = warp_sort<V == 2>(F.top[swz(lane)]); /* all lanes read before any writes */
                __syncwarp();
            }
            if (V == 3 && lane == 0) F.top[k - 1] = F.top[k];
            __syncwarp();
            const int r = warp_top_draw(logits, m, kl, !guess, x0, sp, u, F);
            if (lane == 0) *S.result = r;
        }
        ds.listed = guess;
        __syncthreads();
        const int r = *S.result; /* written again only past draw_sorted's barriers */
        if (tid == 0) SAMPLE_STAT(guess ? (r >= 0 ? "list drawn" : "list fell back") : (r >= 0 ? "top-k drawn" : "top-k fell back"));
        if (r >= 0) return r;
        /* the nucleus was open: the full path below, from the same (untouched) S.keys */
    }
    if (!ds.sorted) {
        if (tid == 0) SAMPLE_STAT("full sort");
        window_sort<V == 2>(S.keys, 31 - __clz(n2));
        ds.sorted = 1;
    }
    return draw_sorted(logits, m, sp, u, S);
}

#endif
