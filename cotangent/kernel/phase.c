/*
 * The gradient phase of PackedAdamW (clip + AdamW step + zero_grad) on x86-64 CPUs with AVX2 and
 * FMA (AVX-512 CPUs included), float32, for the run of each flat buffer whose tensors are all
 * multiples of 16 elements (the buffer's other tensors take PyTorch's kernels: kernel/phase.py).
 *
 * The lane width is that of the ATen kernels that run, which is not always the CPU's: ATen
 * registers norm_stub and fused_adam_stub with REGISTER_DISPATCH, which leaves their AVX-512 slot
 * empty, so torch runs their AVX2 build (8 lanes) under its AVX512 capability too. 16 lanes (two
 * 8-lane halves here, the same additions in the same order) reproduce an AVX-512 registration.
 *
 * Each entry point repeats, operation for operation, what PyTorch's own CPU kernels compute, so
 * that the results are bit for bit those of
 *     clip_grad_norm_(params, max_norm); AdamW(fused=True).step(); zero_grad()
 * Some roundings of the wheel's kernels were decided by its compiler (whether it fused a*b + c
 * into one multiply-add, how it vectorised a scalar tail, which sign a NaN keeps). There the form
 * is a parameter, and cotangent/kernel/selfcheck.py picks the form that reproduces the running torch
 * bit for bit, or the file is not used at all. Compiled with -ffp-contract=off: every rounding
 * here is the one written.
 *
 *   cot_row_norms   2-norms of whole gradient tensors: ATen's reduce-last-dim loop
 *                   (norm_kernel_tensor_iterator_impl): one lanes-wide accumulator (acc += x * x,
 *                   or fused), lanes folded left to right, sqrt. Tensors of equal length (a
 *                   bucket's rows) are read together, each with its own accumulator.
 *   cot_total_coef  the total norm of the per-tensor norms in native clipping's order (the same
 *                   loop with ATen's scalar tail) and native clipping's coefficient,
 *                   min(reciprocal(total + 1e-6f) * max_norm, 1).
 *   cot_update      the step counters + 1, then per element: g *= coef; the vectorised body of
 *                   ATen's fused AdamW CPU kernel (FusedAdamKernel.cpp, ADAMW mode, with its
 *                   grad_scale / found_inf protocol); g = -0.0.
 *                   ATen takes that body for every element of a tensor whose length is a
 *                   multiple of 16, whatever the thread count.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* ---- norms ------------------------------------------------------------------------------ */

/* Rows interleaved in one loop (each with its own accumulator, each in its own order): more
 * memory streams per core than one row at a time, the same bits. */
#define MAX_ROWS 4
#define PREFETCH 256 /* elements ahead of each row (1 KiB) */
static void sumsq_rows(const float* const* x, int rows, int64_t n, int lanes, int acc_fma, float* out) {
  __m256 a[MAX_ROWS][2];
  for (int r = 0; r < rows; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < n; d += lanes) {
    for (int r = 0; r < rows; r++) {
      if (d + PREFETCH < n) _mm_prefetch((const char*)(x[r] + d + PREFETCH), _MM_HINT_T0);
      for (int h = 0; h < lanes / 8; h++) {
        __m256 xv = _mm256_loadu_ps(x[r] + d + 8 * h);
        a[r][h] = acc_fma ? _mm256_fmadd_ps(xv, xv, a[r][h]) : _mm256_add_ps(a[r][h], _mm256_mul_ps(xv, xv));
      }
    }
  }
  for (int r = 0; r < rows; r++) {
    float buf[16];
    _mm256_storeu_ps(buf, a[r][0]);
    _mm256_storeu_ps(buf + 8, a[r][1]);
    float s = buf[0];
    for (int j = 1; j < lanes; j++) s = s + buf[j];
    out[r] = s;
  }
}

/* norms[i] = || base[offsets[i] : offsets[i] + numels[i]] ||_2 for every tensor i, numels[i] % lanes
 * == 0; task t covers tensors first[t] .. first[t] + rows[t] - 1, all of the same length. */
void cot_row_norms(const float* base, const int64_t* offsets, const int64_t* numels, const int64_t* first,
                   const int64_t* rows, int64_t tasks, float* norms, int lanes, int acc_fma, int threads) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t t = 0; t < tasks; t++) {
    const float* x[MAX_ROWS];
    float s[MAX_ROWS];
    const int64_t i0 = first[t];
    for (int r = 0; r < rows[t]; r++) x[r] = base + offsets[i0 + r];
    sumsq_rows(x, (int)rows[t], numels[i0], lanes, acc_fma, s);
    for (int r = 0; r < rows[t]; r++) norms[i0 + r] = sqrtf(s[r]);
  }
}

/* tail_form: 0 s + x*x; 1 fma(x, x, s); 2 groups of four as s + x*x, then the rest as fma */
static float tail_sumsq(float s, const float* x, int64_t n, int tail_form) {
  int64_t d = 0;
  if (tail_form == 2)
    for (int64_t k = n / 4 * 4; k > 0; k--, d++) s = s + x[d] * x[d];
  for (; d < n; d++) s = tail_form ? fmaf(x[d], x[d], s) : s + x[d] * x[d];
  return s;
}

/* total[0] = || norms[perm[0]], ..., norms[perm[count - 1]] ||_2 (native clipping's order),
 * coef[0] = min(reciprocal(total + 1e-6f) * max_norm, 1) (Tensor.__rtruediv__ is reciprocal, then
 * multiply; clamp keeps NaN). scratch holds count floats. */
void cot_total_coef(const float* norms, const int64_t* perm, int64_t count, float* scratch, float max_norm,
                    int lanes, int acc_fma, int tail_form, float* total, float* coef) {
  for (int64_t i = 0; i < count; i++) scratch[i] = norms[perm[i]];
  const float* x = scratch;
  float s;
  sumsq_rows(&x, 1, count - count % lanes, lanes, acc_fma, &s);
  s = tail_sumsq(s, scratch + (count - count % lanes), count % lanes, tail_form);
  const float t = sqrtf(s);
  const float c = (1.0f / (t + 1e-6f)) * max_norm;
  total[0] = t;
  coef[0] = c > 1.0f ? 1.0f : c;
}

/* ---- update ------------------------------------------------------------------------------ */

typedef struct {
  const float* coef; /* clip coefficient */
  float* steps;      /* one float32 step counter per tensor, all equal */
  int64_t count;     /* number of counters */
  double lr, beta1, beta2, weight_decay, eps;
  int amsgrad, maximize;
  int sq_form; /* bit 0: v*b2 + (c*g)*g as fma(c*g, g, v*b2); bit 1: g taken before maximize's negation;
                * bit 2: the same with grad_scale (the wheel's compiler decides each branch apart) */
  int threads;
  int64_t chunk; /* elements per task, a multiple of 16 */
  int zero;      /* write -0.0 over each gradient (zero_grad); 0 where the caller releases the pages */
  /* The fused optimizers' AMP protocol (GradScaler): NULL, or one float each. As ATen's fused AdamW
   * (FusedAdam.cpp, FusedAdamKernel.cpp): every gradient is divided by *grad_scale before the update;
   * the update is skipped entirely where *found_inf == 1; the counters get + 1 before and
   * - *found_inf after (torch.optim.adamw's _fused_adamw). */
  const float* grad_scale;
  const float* found_inf;
} cot_hyper;

static void update_run(float* p, float* g, float* m, float* v, float* mx, int64_t n, const cot_hyper* h) {
  const double step = h->steps[0];
  const double bc1 = 1 - pow(h->beta1, step), bc2 = 1 - pow(h->beta2, step);
  const double c1 = 1 - h->beta1, c2 = 1 - h->beta2, bc2s = sqrt(bc2), step_size = h->lr / bc1;
  const __m256 vcoef = _mm256_set1_ps(*h->coef), neg1 = _mm256_set1_ps(-1.0f);
  const __m256 decay = _mm256_set1_ps((float)(1 - h->lr * h->weight_decay));
  const __m256 w = _mm256_set1_ps((float)c1);
  const int small = fabsf((float)c1) < 0.5f; /* lerp: which end the weight is taken from */
  const __m256 lcoef = small ? w : _mm256_sub_ps(w, _mm256_set1_ps(1.0f));
  const __m256 b2 = _mm256_set1_ps((float)h->beta2), vc2 = _mm256_set1_ps((float)c2);
  const __m256 vbc2s = _mm256_set1_ps((float)bc2s), veps = _mm256_set1_ps((float)h->eps);
  const __m256 nstep = _mm256_set1_ps((float)(-step_size));
  const __m256 nzero = _mm256_set1_ps(-0.0f);
  const int wd = h->weight_decay != 0.f;
  const int unscale = h->grad_scale != 0;
  const __m256 vscale = _mm256_set1_ps(unscale ? *h->grad_scale : 1.0f);
  if (h->found_inf && *h->found_inf == 1.0f) { /* native's kernel returns before touching anything */
    if (h->zero)
      for (int64_t d = 0; d < n; d += 8) _mm256_storeu_ps(g + d, nzero);
    return;
  }
  for (int64_t d = 0; d < n; d += 8) {
    __m256 pv = _mm256_loadu_ps(p + d);
    __m256 gv = _mm256_mul_ps(_mm256_loadu_ps(g + d), vcoef); /* clip */
    if (unscale) gv = _mm256_div_ps(gv, vscale);               /* grad / grad_scale */
    if (h->zero) _mm256_storeu_ps(g + d, nzero);               /* zero_grad */
    const __m256 graw = gv;
    if (h->maximize) gv = _mm256_mul_ps(gv, neg1);
    if (wd) pv = _mm256_mul_ps(pv, decay);
    __m256 mv = _mm256_loadu_ps(m + d);
    mv = _mm256_fmadd_ps(lcoef, _mm256_sub_ps(gv, mv), small ? mv : gv); /* vec::fmadd */
    __m256 vv = _mm256_mul_ps(_mm256_loadu_ps(v + d), b2);
    /* (c2 * -g) * -g == (c2 * g) * g except for a NaN's sign, which compilers fold either way */
    const __m256 gs = (h->sq_form & (unscale ? 4 : 2)) ? graw : gv;
    __m256 gg = _mm256_mul_ps(vc2, gs);
    vv = (h->sq_form & 1) ? _mm256_fmadd_ps(gg, gs, vv) : _mm256_add_ps(vv, _mm256_mul_ps(gg, gs));
    _mm256_storeu_ps(m + d, mv);
    _mm256_storeu_ps(v + d, vv);
    __m256 den = vv;
    if (h->amsgrad) { /* vec::maximum: NaN propagates */
      __m256 a = _mm256_loadu_ps(mx + d);
      den = _mm256_or_ps(_mm256_max_ps(a, vv), _mm256_cmp_ps(a, vv, _CMP_UNORD_Q));
      _mm256_storeu_ps(mx + d, den);
    }
    den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(den), vbc2s), veps);
    pv = _mm256_add_ps(pv, _mm256_div_ps(_mm256_mul_ps(nstep, mv), den));
    _mm256_storeu_ps(p + d, pv);
  }
}

/* The run [0, n) of the flat buffers, in tasks of h->chunk elements, last task first (the
 * gradients the norm pass read last are the likeliest still in cache). n % 16 == 0. */
void cot_update(float* p, float* g, float* m, float* v, float* mx, int64_t n, const cot_hyper* h) {
  for (int64_t i = 0; i < h->count; i++) h->steps[i] = h->steps[i] + 1.0f; /* steps.add_(1) */
  const int64_t tasks = (n + h->chunk - 1) / h->chunk;
#pragma omp parallel for schedule(static) num_threads(h->threads)
  for (int64_t k = tasks - 1; k >= 0; k--) {
    const int64_t s = k * h->chunk, e = s + h->chunk < n ? s + h->chunk : n;
    update_run(p + s, g + s, m + s, v + s, mx ? mx + s : 0, e - s, h);
  }
  if (h->found_inf) /* steps.sub_(found_inf) */
    for (int64_t i = 0; i < h->count; i++) h->steps[i] = h->steps[i] - *h->found_inf;
}
