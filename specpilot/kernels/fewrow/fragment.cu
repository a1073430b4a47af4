// Few-row products on the tensor cores, weights as operand A ("swap-AB"): Y[m, n] = sum_k X[m, k] W[n, k] for
// 1..64 rows of X, with W in BF16 or in W12 (specpilot/w12/format.py), decoded in registers.
//
// Each warp owns T tiles of 16 weight rows and runs mma.m16n8k16 (bf16 in, fp32 accumulate) with an 8-row tile of
// X as operand B (MT of them for up to 8 * MT rows). K goes in chunks of 128 columns; lane (g = lane / 4,
// t = lane % 4) takes columns 32t..32t+31 of the chunk for weight rows g and g + 8: two 16-byte loads of the byte
// plane and one of the nibble plane per row (BF16: four), so a warp's loads of the byte plane are whole 128-byte
// lines (with 64-column chunks they were half lines, and W12 ran no faster than BF16: bench/HISTORY.md). Which
// physical columns sit in which mma slot does not matter to a dot product as long as X uses the same map: k-step j
// (0..7) of a chunk takes the lane's column pairs 2j (slots 2t, 2t+1) and 2j + 1 (slots 2t + 8, 2t + 9), and the
// lane loads X's same 32 columns. The weights of the next D chunks are loaded into registers while D chunks are
// multiplied. X comes in one of three ways (X_AHEAD): 0, read from L1 as it goes; 1, with one row tile, its
// fragments loaded ahead with the weights; 2, a block's ring of X chunks in shared memory, copied (cp.async) two
// chunks ahead by all its threads and read by each warp a half chunk at a time, so that many rows cost neither
// L2 round trips nor registers. A ring of cp.async copies of the weights in place of the registers ran about 3x
// slower on the H200, and L2 prefetches ahead of the loads gained nothing (bench/HISTORY.md). W12 planes may be
// tiled (TILED): a warp's chunk is then one contiguous 2 KB of the byte plane and 1 KB of the nibble plane.
//
// Decoding a pair of adjacent columns into a bf16x2 register (the W12 format's byte [s c3..c0 m6..m4], nibble
// m3..m0, row base b): h = the two bytes in the two 16-bit lanes (prmt), n = their nibbles the same way (one
// shift and mask of the nibble word, the base's b << 7 OR-ed in with the same instruction), then
// bits = 16 h + 240 (h & 0x80) + n = s << 15 | (c + b) << 7 | m6..m4 << 4 | m3..m0: about three integer
// operations per weight. The escape code 0 decodes to (sign, b, mantissa), a finite value; the epilogue adds
// x * (true - decoded) for each escape of the row, after the row's sum is complete.
//
// The reduction order of an output is fixed by the K split (grid.y = S pieces of the chunks, each summed in
// chunk order by one warp, then summed in piece order by the last block to arrive), never by the number of rows:
// a row's result is the same bits whether it runs alone or with 63 others. No atomic adds a value (one counts
// arrivals). Columns past K (a multiple of 32) are zeros on both sides.

// Compiled by NVRTC (kernels/nvrtc.py) with the macros WEIGHTS_W12 (1: W12, 0: BF16), VIEW8, TILED, TILES,
// M_TILES, AHEAD and X_AHEAD (few_row's T, MT, D and XMODE); no headers: bf16 values travel as their 16 bits.

typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef uint16_t bf16;

#ifndef VIEW8  // 1: W12's 8-bit view (two-level verification's cheap pass): the byte plane alone, each weight's
#define VIEW8 0  // low mantissa bits read as their midpoint 1000, escapes exact
#endif
#ifndef TILED  // 1: the W12 planes in tiles of 16 rows x 128 columns (w12/format.tile): a warp's step reads one
#define TILED 0  // contiguous tile of each plane
#endif

namespace {

constexpr int CHUNK = 128;  // columns a warp takes per step: 32 a lane, whole 128-byte lines of the byte plane
constexpr int NIB = 8;      // W12: where the nibble words start (after the byte plane's 8)

// The line of the tiled planes (w12/format.tile: 16 rows x one chunk a tile) holding chunk c of weight row `row`:
// its bytes start at line * CHUNK in the byte plane and line * CHUNK / 2 in the nibble plane. The product and the
// load-time decode (w12_decode) both address the tiles through it.
__device__ __forceinline__ long tile_line(long row, int c, int K) {
  return ((row >> 4) * ((K + CHUNK - 1) / CHUNK) + c) * 16 + (row & 15);
}

struct Rows {  // one lane's share of a chunk for one tile: rows g and g + 8
  uint32_t w[2][16];  // W12: words 0-7 the byte plane, 8-11 the nibble plane; BF16: the 16 bf16x2 words
};

template <bool W12>
__device__ __forceinline__ void load_rows(Rows& r, const uint8_t* __restrict__ planes,
                                          const uint8_t* __restrict__ nibbles, long row0, int N, int K, int c, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const long row = row0 + 8 * h;
    const int col = c * CHUNK + 32 * t;
    // a row past N: its outputs are not stored; columns past K (K is a multiple of 32): zeros, as X's there
    if (row >= N) continue;
    if (col >= K) {
#pragma unroll
      for (int q = 0; q < 16; ++q) r.w[h][q] = 0;
      continue;
    }
    if (W12) {
      // the lane's 32 bytes of the byte plane and 16 of the nibble plane, in rows or in the row's tile
      const long tile = TILED ? tile_line(row, c, K) : 0;
      const uint8_t* bp = TILED ? planes + tile * CHUNK + 32 * t : planes + row * K + col;
      const uint8_t* np = TILED ? nibbles + tile * (CHUNK / 2) + 16 * t : nibbles + row * (K / 2) + col / 2;
      const uint4* b = reinterpret_cast<const uint4*>(bp);
      const uint4 b0 = __ldcs(b), b1 = __ldcs(b + 1);
      const uint4 n = VIEW8 ? make_uint4(0, 0, 0, 0) : __ldcs(reinterpret_cast<const uint4*>(np));
      const uint32_t v[12] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w, n.x, n.y, n.z, n.w};
#pragma unroll
      for (int q = 0; q < 12; ++q) r.w[h][q] = v[q];
    } else {
      const uint4* p = reinterpret_cast<const uint4*>(planes + 2 * (row * K + col));
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint4 a = __ldcs(p + u);
        r.w[h][4 * u] = a.x; r.w[h][4 * u + 1] = a.y; r.w[h][4 * u + 2] = a.z; r.w[h][4 * u + 3] = a.w;
      }
    }
  }
}

// X's row mt * 8 + g, columns 32t..32t+31 of chunk c (B fragments of eight k-steps); zeros past M and K.
__device__ __forceinline__ void load_x(uint32_t (&b)[16], const bf16* __restrict__ x, int ldx, int m, int M, int K,
                                       int c, int t) {
  const int col = c * CHUNK + 32 * t;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (m < M && col < K) v = __ldg(reinterpret_cast<const uint4*>(x + (long)m * ldx + col) + u);
    b[4 * u] = v.x; b[4 * u + 1] = v.y; b[4 * u + 2] = v.z; b[4 * u + 3] = v.w;
  }
}

struct Chunk1 {  // with one row tile, X's fragments travel with the weights
  uint32_t x[16];
};

// X_AHEAD 2: the ring of X chunks in shared memory, RING stages of 8 MT rows x 16 units of 16 bytes. A lane reads
// units 4t + 2 half + v of row 8 mt + g; the unit's slot is swizzled so that the eight lanes of each quarter
// warp (two rows, t = 0..3) hit eight different 16-byte bank groups.
constexpr int UNITS = CHUNK / 8;
template <int MT>
constexpr int ring_stages() { return MT >= 8 ? 2 : 3; }  // 48 KB of static shared memory at most

__device__ __forceinline__ int x_slot(int row, int unit) {
  return row * UNITS + (unit ^ ((unit >> 3) & 1) ^ ((row & 1) << 1));
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  uint32_t a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// Chunk c of X's rows 0..8 MT - 1 into a stage (zeros past M and K), one 16-byte copy per thread and unit, as
// one group; past the block's chunks (c >= c_hi) an empty group, so that every thread counts groups alike.
template <int MT>
__device__ __forceinline__ void stage_x(uint4* stage, const bf16* __restrict__ x, int ldx, int M, int K, int c,
                                        int c_hi) {
  for (int e = threadIdx.x; c < c_hi && e < 8 * MT * UNITS; e += blockDim.x) {
    const int row = e / UNITS, unit = e % UNITS, col = c * CHUNK + 8 * unit;
    const bool in = row < M && col < K;
    const bf16* src = in ? x + (long)row * ldx + col : x;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(stage + x_slot(row, unit))),
                 "l"(src), "r"(in ? 16 : 0));
  }
  asm volatile("cp.async.commit_group;\n");
}

template <int PENDING>
__device__ __forceinline__ void stage_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING)); }

// Column pair q (0..15) of one row as bf16x2; base2 = b << 7 | b << 23.
template <bool W12>
__device__ __forceinline__ uint32_t pair(const uint32_t* w, int q, uint32_t base2) {
  if (!W12) return w[q];
  const uint32_t h = __byte_perm(w[q >> 1], 0, (q & 1) ? 0x4342 : 0x4140);
  const uint32_t n = (VIEW8 ? 0x00080008u : (w[NIB + (q >> 2)] >> (4 * (q & 3))) & 0x000F000Fu) | base2;
  return h * 16u + (h & 0x00800080u) * 240u + n;
}

__device__ __forceinline__ void mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One chunk: 8 k-steps x MT row tiles x T tiles of mma, the weights decoded a half chunk (4 k-steps) at a time.
// X (XMODE, fragment.cu's X_AHEAD): 0, every row tile's fragments read here; 1, xr holds row tile 0's, loaded
// ahead (MT == 1); 2, read from the shared stage xs a half chunk and a row tile at a time.
template <bool W12, int T, int MT, int XMODE>
__device__ __forceinline__ void multiply(float (&acc)[T][MT][4], const Rows (&r)[T], const uint32_t (&base2)[T][2],
                                         const Chunk1& xr, const uint4* xs, const bf16* __restrict__ x, int ldx,
                                         int M, int K, int c, int g, int t) {
  constexpr int MB = XMODE == 2 ? 1 : MT;  // row tiles whose fragments are held at once
  uint32_t b[MB][16];
#pragma unroll
  for (int mt = 0; mt < MB; ++mt) {
    if (XMODE == 1) {
#pragma unroll
      for (int q = 0; q < 16; ++q) b[mt][q] = xr.x[q];
    } else if (XMODE == 0) {
      load_x(b[mt], x, ldx, mt * 8 + g, M, K, c, t);
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint32_t a[T][2][8];
#pragma unroll
    for (int i = 0; i < T; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < 8; ++q) a[i][h][q] = pair<W12>(r[i].w[h], 8 * half + q, base2[i][h]);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int mb = XMODE == 2 ? 0 : mt;
      if (XMODE == 2) {
#pragma unroll
        for (int v = 0; v < 2; ++v) {
          const uint4 u = xs[x_slot(mt * 8 + g, 4 * t + 2 * half + v)];
          b[0][8 * half + 4 * v] = u.x; b[0][8 * half + 4 * v + 1] = u.y;
          b[0][8 * half + 4 * v + 2] = u.z; b[0][8 * half + 4 * v + 3] = u.w;
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < T; ++i)
          mma(acc[i][mt], a[i][0][2 * j], a[i][1][2 * j], a[i][0][2 * j + 1], a[i][1][2 * j + 1],
              b[mb][8 * half + 2 * j], b[mb][8 * half + 2 * j + 1]);
    }
  }
}

__device__ __forceinline__ float bf16_bits(uint32_t bits) { return __uint_as_float(bits << 16); }
__device__ __forceinline__ float to_float(bf16 v) { return bf16_bits(v); }
__device__ __forceinline__ bf16 to_bf16(float x) {  // round to nearest even, as PyTorch's casts
  bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
}

// The row's escape correction for activation row m: sum over escapes of x[m, col] * (true - decoded).
__device__ __forceinline__ float escape_fix(const int* __restrict__ esc_ptr, const int* __restrict__ esc_col,
                                            const uint16_t* __restrict__ esc_bits, uint32_t base,
                                            const bf16* __restrict__ x, int ldx, long n, int m) {
  float fix = 0.f;
  for (int e = esc_ptr[n]; e < esc_ptr[n + 1]; ++e) {
    const uint32_t bits = esc_bits[e];
    const float xv = to_float(x[(long)m * ldx + esc_col[e]]);
    const uint32_t held = VIEW8 ? (bits & 0x8070u) | 0x8u : bits & 0x807Fu;  // sign and mantissa the planes hold
    fix += xv * bf16_bits(bits) - xv * bf16_bits(held | (base << 7));
  }
  return fix;
}

struct Epilogue {
  const uint8_t* base;  // W12 row bases (null for BF16)
  const int* esc_ptr;
  const int* esc_col;
  const uint16_t* esc_bits;
  const bf16* bias;      // [N] or null
  const bf16* residual;  // [M, ldr] or null
  int ldr;
};

// Output (m, n) from its complete sum: escapes, bias, the BF16 rounding, the residual.
__device__ __forceinline__ bf16 finish(float acc, const Epilogue& e, const bf16* x, int ldx,
                                                long n, int m) {
  if (e.base != nullptr) acc += escape_fix(e.esc_ptr, e.esc_col, e.esc_bits, e.base[n], x, ldx, n, m);
  if (e.bias != nullptr) acc += to_float(e.bias[n]);
  if (e.residual == nullptr) return to_bf16(acc);
  const float rounded = to_float(to_bf16(acc));
  return to_bf16(rounded + to_float(e.residual[(long)m * e.ldr + n]));
}

// The S partial sums of output (m, n), added in piece order (four loads in flight).
__device__ __forceinline__ float sum_parts(const float* __restrict__ parts, int S, long MN, long i) {
  const float* p = parts + i;
  float sum = 0.f;
  int q = 0;
  for (; q + 4 <= S; q += 4) {
    const float v0 = __ldcg(p + q * MN), v1 = __ldcg(p + (q + 1) * MN), v2 = __ldcg(p + (q + 2) * MN),
                v3 = __ldcg(p + (q + 3) * MN);
    sum += v0;
    sum += v1;
    sum += v2;
    sum += v3;
  }
  for (; q < S; ++q) sum += __ldcg(p + q * MN);
  return sum;
}

// grid (ceil(N / (16 T warps)), S). Block (bx, s) takes chunks [c_lo, c_hi), D at a time, the next D's loads in
// flight while these are multiplied (XMODE 1: X's fragments too; XMODE 2: X's chunks copied into the shared ring
// RING - 1 ahead). With S > 1 each block writes its partial sums; then, when `arrivals` is given, the last block
// of a column of blocks to arrive (an arrival counter, reset by that block) adds the S of each output in piece
// order and finishes them, else `reduce_parts` does, launched next.
template <bool W12, int T, int MT, int D, int XMODE>
__device__ void few_row(const uint8_t* __restrict__ planes, const uint8_t* __restrict__ nibbles, Epilogue e,
                        const bf16* __restrict__ x, int ldx, bf16* __restrict__ y, int ldy,
                        float* __restrict__ parts, int* __restrict__ arrivals, int M, int N, int K) {
  constexpr int RING = XMODE == 2 ? ring_stages<MT>() : 1;
  __shared__ int last;
  __shared__ __align__(16) uint4 ring[XMODE == 2 ? RING * 8 * MT * UNITS : 1];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long tile0 = ((long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * T;
  const int chunks = (K + CHUNK - 1) / CHUNK, S = gridDim.y, s = blockIdx.y;
  const int c_lo = (int)((long)s * chunks / S), c_hi = (int)((long)(s + 1) * chunks / S);

  uint32_t base2[T][2];
#pragma unroll
  for (int i = 0; i < T; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long n = (tile0 + i) * 16 + g + 8 * h;
      const uint32_t b = (W12 && n < N) ? e.base[n] : 0u;
      base2[i][h] = (b << 7) | (b << 23);
    }
  float acc[T][MT][4];
#pragma unroll
  for (int i = 0; i < T; ++i)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][mt][v] = 0.f;

  Rows cur[D][T], nxt[D][T];
  Chunk1 xc[D], xn[D];
  if (XMODE == 2)  // the ring's first RING - 1 chunks (a group each, empty past c_hi: the count stays uniform)
#pragma unroll
    for (int j = 0; j < RING - 1; ++j) stage_x<MT>(ring + j * 8 * MT * UNITS, x, ldx, M, K, c_lo + j, c_hi);
#pragma unroll
  for (int d = 0; d < D; ++d) {
    if (c_lo + d >= c_hi) continue;
#pragma unroll
    for (int i = 0; i < T; ++i) load_rows<W12>(cur[d][i], planes, nibbles, (tile0 + i) * 16 + g, N, K, c_lo + d, t);
    if (XMODE == 1) load_x(xc[d].x, x, ldx, g, M, K, c_lo + d, t);
  }
  for (int c = c_lo; c < c_hi; c += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      if (c + D + d >= c_hi) continue;
#pragma unroll
      for (int i = 0; i < T; ++i)
        load_rows<W12>(nxt[d][i], planes, nibbles, (tile0 + i) * 16 + g, N, K, c + D + d, t);
      if (XMODE == 1) load_x(xn[d].x, x, ldx, g, M, K, c + D + d, t);
    }
#pragma unroll
    for (int d = 0; d < D; ++d) {
      if (c + d >= c_hi) continue;
      const uint4* xs = ring;
      if (XMODE == 2) {
        // chunk c + d's copies are done (RING - 2 later groups may be pending) and every warp is past the chunk
        // before it, whose stage the copy of chunk c + d + RING - 1 may now take
        const int i = c + d - c_lo;
        stage_wait<RING - 2>();
        __syncthreads();
        const int ahead = c + d + RING - 1;
        stage_x<MT>(ring + ((i + RING - 1) % RING) * 8 * MT * UNITS, x, ldx, M, K, ahead, c_hi);
        xs = ring + (i % RING) * 8 * MT * UNITS;
      }
      multiply<W12, T, MT, XMODE>(acc, cur[d], base2, xc[d], xs, x, ldx, M, K, c + d, g, t);
    }
#pragma unroll
    for (int d = 0; d < D; ++d) {
#pragma unroll
      for (int i = 0; i < T; ++i) cur[d][i] = nxt[d][i];
      xc[d] = xn[d];
    }
  }

  // acc[i][mt] = C[n = tile row g, g + 8][m = mt * 8 + 2t, 2t + 1]
#pragma unroll
  for (int i = 0; i < T; ++i)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const long n = (tile0 + i) * 16 + g + 8 * (v >> 1);
        const int m = mt * 8 + 2 * t + (v & 1);
        if (n >= N || m >= M) continue;
        if (S == 1)
          y[(long)m * ldy + n] = finish(acc[i][mt][v], e, x, ldx, n, m);
        else
          parts[((long)s * M + m) * N + n] = acc[i][mt][v];
      }
  if (S == 1 || arrivals == nullptr) return;
  __threadfence();  // this block's partial sums are visible before its arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrivals + blockIdx.x, 1) == S - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const long rows = 16L * T * (blockDim.x >> 5), n0 = (long)blockIdx.x * rows;
  for (long i = threadIdx.x; i < rows * M; i += blockDim.x) {
    const long n = n0 + i % rows;
    const int m = (int)(i / rows);
    if (n < N) y[(long)m * ldy + n] = finish(sum_parts(parts, S, (long)M * N, (long)m * N + n), e, x, ldx, n, m);
  }
  if (threadIdx.x == 0) arrivals[blockIdx.x] = 0;  // ready for the next launch
}

}  // namespace

// The W12 planes decoded to BF16 bits with the product's own decode (escapes left as the planes hold them), read
// where the product reads them (in rows, or by tile_line when TILED): what the load-time check compares with the
// original. The output is in rows either way.
extern "C" __global__ void w12_decode(const uint8_t* __restrict__ planes, const uint8_t* __restrict__ nibbles,
                                      const uint8_t* __restrict__ base, uint32_t* __restrict__ out, int N, int K) {
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;  // one thread per 8 columns
  if (i >= (long)N * (K / 8)) return;
  const long n = i / (K / 8);
  const int k8 = (int)(i % (K / 8));
  const int col = 8 * k8;
  const long line = TILED ? tile_line(n, col / CHUNK, K) : 0;
  const uint8_t* bp = TILED ? planes + line * CHUNK + col % CHUNK : planes + n * K + col;
  const uint8_t* np = TILED ? nibbles + line * (CHUNK / 2) + (col % CHUNK) / 2 : nibbles + n * (K / 2) + col / 2;
  uint32_t w[NIB + 1];
  const uint2 b = *reinterpret_cast<const uint2*>(bp);
  w[0] = b.x; w[1] = b.y;
  w[NIB] = *reinterpret_cast<const uint32_t*>(np);
  const uint32_t b2 = ((uint32_t)base[n] << 7) | ((uint32_t)base[n] << 23);
#pragma unroll
  for (int q = 0; q < 4; ++q) out[n * (K / 2) + 4 * k8 + q] = pair<true>(w, q, b2);
}

#ifndef TILES  // the macros NVRTC is given; these defaults let nvcc build the file alone
#define WEIGHTS_W12 1
#define TILES 1
#define M_TILES 1
#define AHEAD 1
#define X_AHEAD 0
#endif

#define EPILOGUE_PARAMS                                                                                          \
  const uint8_t *base, const int *esc_ptr, const int *esc_col, const uint16_t *esc_bits, const bf16 *bias,      \
      const bf16 *residual, int ldr
#define EPILOGUE Epilogue{base, esc_ptr, esc_col, esc_bits, bias, residual, ldr}

extern "C" __global__ void __launch_bounds__(128) few_row_product(const uint8_t* planes, const uint8_t* nibbles,
                                                                  EPILOGUE_PARAMS, const bf16* x, int ldx,
                                                                  bf16* y, int ldy, float* parts, int* arrivals,
                                                                  int M, int N, int K) {
  few_row<WEIGHTS_W12 != 0, TILES, M_TILES, AHEAD, (X_AHEAD == 1 && M_TILES > 1 ? 0 : X_AHEAD)>(
      planes, nibbles, EPILOGUE, x, ldx, y, ldy, parts, arrivals, M, N, K);
}

// What few_row_product's blocks leave when it runs without arrival counters: one thread per output.
extern "C" __global__ void reduce_parts(const float* __restrict__ parts, int S, EPILOGUE_PARAMS,
                                        const bf16* __restrict__ x, int ldx, bf16* __restrict__ y, int ldy, int M,
                                        int N) {
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long)M * N) return;
  const int m = (int)(i / N);
  const long n = i % N;
  y[(long)m * ldy + n] = finish(sum_parts(parts, S, (long)M * N, i), EPILOGUE, x, ldx, n, m);
}
