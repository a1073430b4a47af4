// One-row decode attention whose splits merge in a thread-block cluster (kernels/attention/cluster.py).
//
// A cluster of SPLITS blocks takes one (batch, KV head): block `rank` of it one contiguous share of the
// visible slots, its WARPS warps a slot each in turn, each lane EPL = D / 32 elements of a row. The G query
// heads of the KV head are scored against every K row the warp loads (fp32, base-2 exponent, scale folded
// into q). The warps' online-softmax states merge through this block's shared memory, the blocks' through
// block 0's (distributed shared memory: `mapa` + `st.shared::cluster`, then one cluster barrier), so that
// the merge costs no round trip through the L2. Block 0 writes the output.
//
// Visible slots (Visibility.dense for one new row, causal, no window): s < cache_len, and s == start.
// Compiled by NVRTC with these macros: G, D, SPLITS, WARPS, LATE, PRELOAD, HALF (1: fp16, else bf16).
// PRELOAD: the warp's first K/V rows among the committed slots are loaded before the PDL wait (written at
// least two kernels earlier; only q and the new row come from the kernel just before). LATE: the next kernel
// is released after this one's wait instead of at its start.

#define EPL (D / 32)
#define WORDS (EPL / 2)
#define CHUNK 8  // rows a warp has in flight
#define NEG_INF __int_as_float(0xff800000)

struct __align__(EPL * 2) Row { unsigned int w[WORDS]; };

__device__ __forceinline__ float elem(const Row& r, int i) {
    unsigned int half = (i & 1) ? (r.w[i >> 1] >> 16) : (r.w[i >> 1] & 0xffffu);
#if HALF
    float f;
    unsigned short h = (unsigned short)half;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return __uint_as_float(half << 16);
#endif
}

__device__ __forceinline__ unsigned short to_half(float x) {
    unsigned short r;
#if HALF
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
#else
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
#endif
    return r;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Store x at the same offset of block 0's shared memory in this cluster.
__device__ __forceinline__ void store_at_leader(const float* mine, float x) {
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(remote) : "r"(smem_addr(mine)));
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(x) : "memory");
}

struct State { float m[G], l[G], acc[G][EPL]; };

// Fold up to CHUNK rows (k, v; ok: visible) into the warp's online softmax; every lane ends with the same m, l.
__device__ __forceinline__ void fold(State& st, const float (&q)[G][EPL], const Row* k, const Row* v,
                                     const bool* ok) {
#pragma unroll
    for (int g = 0; g < G; g++) {
        float sc[CHUNK];
        float m_new = st.m[g];
#pragma unroll
        for (int c = 0; c < CHUNK; c++) {
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++) dot = fmaf(q[g][e], elem(k[c], e), dot);
            dot = warp_sum(dot);
            sc[c] = ok[c] ? dot : NEG_INF;
            m_new = fmaxf(m_new, sc[c]);
        }
        float m_safe = m_new == NEG_INF ? 0.0f : m_new;  // nothing seen yet
        float alpha = exp2f(st.m[g] - m_safe);
        st.l[g] *= alpha;
#pragma unroll
        for (int e = 0; e < EPL; e++) st.acc[g][e] *= alpha;
#pragma unroll
        for (int c = 0; c < CHUNK; c++) {
            float p = exp2f(sc[c] - m_safe);
            st.l[g] += p;
#pragma unroll
            for (int e = 0; e < EPL; e++) st.acc[g][e] = fmaf(p, elem(v[c], e), st.acc[g][e]);
        }
        st.m[g] = m_new;
    }
}

// Merge `n` online-softmax states laid out as m[n][G], l[n][G], acc[n][G][D]: the (g, d) element.
__device__ __forceinline__ void merge(const float* m, const float* l, const float* acc, int n, int g, int d,
                                      float& m_out, float& l_out, float& a_out) {
    float mx = NEG_INF;
    for (int i = 0; i < n; i++) mx = fmaxf(mx, m[i * G + g]);
    float ms = mx == NEG_INF ? 0.0f : mx;
    float ls = 0.0f, as = 0.0f;
    for (int i = 0; i < n; i++) {
        float w = exp2f(m[i * G + g] - ms);  // 0 for a state that saw nothing
        ls = fmaf(w, l[i * G + g], ls);
        as = fmaf(w, acc[(i * G + g) * D + d], as);
    }
    m_out = mx;
    l_out = ls;
    a_out = as;
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
decode_attention(const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
                 const unsigned short* __restrict__ v, const long long* __restrict__ cache_len_p,
                 const long long* __restrict__ start_p, unsigned short* __restrict__ out,
                 long long sq_b, long long sq_h, long long sk_b, long long sk_h, long long sk_l,
                 long long sv_b, long long sv_h, long long sv_l, long long so_b, long long so_h,
                 int hkv, int length, float qk_scale) {
    __shared__ float warp_m[WARPS * G], warp_l[WARPS * G], warp_acc[WARPS * G * D];
    __shared__ float split_m[SPLITS * G], split_l[SPLITS * G], split_acc[SPLITS * G * D];

    unsigned int rank, cluster;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm("mov.u32 %0, %%clusterid.x;" : "=r"(cluster));
    const int b = cluster / hkv, h = cluster % hkv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // A block may write another's shared memory only once that block runs: arrive now, wait before the
    // first remote store (by then every block of the cluster has long arrived, so the wait is free).
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#if !LATE
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    const int cache_len = (int)min(cache_len_p[b], (long long)length);
    const int start = (int)start_p[b];
    const int hi = max(cache_len, min(start + 1, length));
    const int per = (hi + SPLITS - 1) / SPLITS;
    const int s_begin = rank * per, s_end = min(s_begin + per, hi);
    const unsigned short* kb = k + b * sk_b + h * sk_h + lane * EPL;
    const unsigned short* vb = v + b * sv_b + h * sv_h + lane * EPL;

    Row kr[CHUNK], vr[CHUNK];
    bool ok[CHUNK], loaded[CHUNK];
    const int first = s_begin + warp;
#pragma unroll
    for (int c = 0; c < CHUNK; c++) {
        int s = first + c * WARPS;
        loaded[c] = PRELOAD && s < s_end && s < cache_len && s != start;
        if (loaded[c]) {
            kr[c] = *(const Row*)(kb + s * sk_l);
            vr[c] = *(const Row*)(vb + s * sv_l);
        }
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
#if LATE
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    float qf[G][EPL];
#pragma unroll
    for (int g = 0; g < G; g++) {
        Row r = *(const Row*)(q + b * sq_b + (h * G + g) * sq_h + lane * EPL);
#pragma unroll
        for (int e = 0; e < EPL; e++) qf[g][e] = elem(r, e) * qk_scale;
    }
    State st;
#pragma unroll
    for (int g = 0; g < G; g++) {
        st.m[g] = NEG_INF;
        st.l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) st.acc[g][e] = 0.0f;
    }
    for (int base = first; base < s_end; base += CHUNK * WARPS) {
#pragma unroll
        for (int c = 0; c < CHUNK; c++) {
            int s = base + c * WARPS;
            ok[c] = s < s_end && (s < cache_len || s == start);
            if (!ok[c]) {  // zeros, not stale rows: p = 0 times an Inf would be NaN
#pragma unroll
                for (int w = 0; w < WORDS; w++) kr[c].w[w] = vr[c].w[w] = 0u;
            } else if (!loaded[c]) {
                kr[c] = *(const Row*)(kb + s * sk_l);
                vr[c] = *(const Row*)(vb + s * sv_l);
            }
            loaded[c] = false;
        }
        fold(st, qf, kr, vr, ok);
    }

    // The warps' states, merged in this block; then this block's state into block 0's shared memory.
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) {
            warp_m[warp * G + g] = st.m[g];
            warp_l[warp * G + g] = st.l[g];
        }
#pragma unroll
        for (int e = 0; e < EPL; e++) warp_acc[(warp * G + g) * D + lane * EPL + e] = st.acc[g][e];
    }
    __syncthreads();
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    for (int i = threadIdx.x; i < G * D; i += WARPS * 32) {
        const int g = i / D, d = i % D;
        float m, l, a;
        merge(warp_m, warp_l, warp_acc, WARPS, g, d, m, l, a);
        store_at_leader(&split_acc[(rank * G + g) * D + d], a);
        if (d == 0) {
            store_at_leader(&split_m[rank * G + g], m);
            store_at_leader(&split_l[rank * G + g], l);
        }
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (rank != 0) return;
    for (int i = threadIdx.x; i < G * D; i += WARPS * 32) {
        const int g = i / D, d = i % D;
        float m, l, a;
        merge(split_m, split_l, split_acc, SPLITS, g, d, m, l, a);
        out[b * so_b + (h * G + g) * so_h + d] = to_half(a / (l > 0.0f ? l : 1.0f));
    }
}
